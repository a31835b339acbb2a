"""Tokenizers: lossless round trips, specs, and the hf / tiktoken paths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_prep import tokenizer as tk
from data_prep.synthetic import StoryCorpus
from rrtrain.core.errors import UsageError

UNICODE_HEAVY = [
    "日本語のテキストと絵文字 🙂🚀 mixed with ASCII.",
    "Ünïcödé — “quotes”, ‘single’, naïve café, Straße, ΕΛΛΗΝΙΚΑ, русский текст.",
    "tabs\tand\r\nwindows newlines\n\n  leading spaces and trailing  ",
    "\x00\x01 control chars \x7f and combining e\u0301 and ZWJ 👩\u200d👩\u200d👧",
    "עברית ועربي mixed RTL; हिन्दी; 中文标点，。！",
]
texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200)


@pytest.fixture(scope="module")
def bpe() -> tk.Tokenizer:
    docs = list(StoryCorpus(400, seed=1))
    return tk.build("bpe:600", texts=iter(docs + UNICODE_HEAVY))


def _roundtrip(tok: tk.Tokenizer, text: str) -> str:
    (ids,) = tok.encode_batch([text])
    assert ids.dtype == np.uint32
    assert tok.eos_id not in ids.tolist()
    return tok.decode(ids.tolist())


@pytest.mark.parametrize("text", UNICODE_HEAVY + list(StoryCorpus(20, seed=3)))
def test_byte_and_bpe_round_trip_fixed_texts(text, bpe):
    assert _roundtrip(tk.ByteTokenizer(), text) == text
    assert _roundtrip(bpe, text) == text


@settings(max_examples=150, deadline=None)
@given(text=texts)
def test_byte_round_trip_any_text(text):
    assert _roundtrip(tk.ByteTokenizer(), text) == text


@settings(max_examples=150, deadline=None)
@given(text=texts)
def test_bpe_round_trip_any_text(text, bpe):
    assert _roundtrip(bpe, text) == text


def test_bpe_compresses_and_reserves_eos(bpe):
    story = next(iter(StoryCorpus(1, seed=9)))
    (ids,) = bpe.encode_batch([story])
    assert len(ids) < len(story.encode()) / 2.5  # it learned merges from the corpus
    assert bpe.vocab_size <= 600 and bpe.eos_id == 0
    assert bpe.decode([bpe.eos_id]) == tk.EOS_TEXT


def test_bpe_training_is_deterministic():
    docs = list(StoryCorpus(200, seed=2))
    a = tk.build("bpe:400", texts=iter(docs))
    b = tk.build("bpe:400", texts=iter(docs))
    assert a.vocab_hash() == b.vocab_hash()


def test_hf_tokenizer_json_path_round_trips_and_finds_eos(tmp_path, bpe):
    bpe.save(str(tmp_path))
    for arg in (str(tmp_path / "tokenizer.json"), str(tmp_path)):
        tok = tk.build(f"hf:{arg}")
        assert tok.eos_id == bpe.eos_id and tok.vocab_size == bpe.vocab_size
        assert _roundtrip(tok, UNICODE_HEAVY[1]) == UNICODE_HEAVY[1]
    with pytest.raises(UsageError, match="has no token '<nope>'"):
        tk.build(f"hf:{tmp_path}", eos_token="<nope>")
    with pytest.raises(UsageError, match="no tokenizer.json"):
        tk.build(f"hf:{tmp_path / 'missing.json'}")


def test_tiktoken_loads_or_fails_with_one_line():
    try:
        tok = tk.build("tiktoken:gpt2")
    except UsageError as err:  # no network and no cached encoding: a clear error, not a traceback
        assert "\n" not in str(err) and "gpt2" in str(err)
        return
    assert tok.vocab_size == 50257 and tok.eos_id == 50256
    assert _roundtrip(tok, UNICODE_HEAVY[0]) == UNICODE_HEAVY[0]


@pytest.mark.parametrize("spec, message", [
    ("word", "unknown tokenizer"),
    ("bpe:abc", "must be an integer"),
    ("bpe:100", "too small"),
    (f"bpe:{1 << 32}", "too large for uint32"),
    ("byte:5", "takes no argument"),
    ("hf:", "needs an argument"),
])
def test_bad_specs(spec, message):
    with pytest.raises(UsageError, match=message):
        tk.parse_spec(spec)
