"""Tokenizers: lossless round trips, specs, and the hf / tiktoken paths."""

from __future__ import annotations

import os

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


def test_tiktoken_offline_error_names_the_cache_variable(monkeypatch):
    tiktoken = pytest.importorskip("tiktoken")

    def offline(name):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(UsageError) as err:
        tk.build("tiktoken:gpt2")
    assert "TIKTOKEN_CACHE_DIR" in str(err.value) and "gpt2" in str(err.value) and "\n" not in str(err.value)


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


def test_hf_path_split_source_reads_the_named_split_of_a_local_folder(tmp_path, monkeypatch):
    """`--source hf:PATH:SPLIT` (docs/data.md): a local folder of data files named by split, read offline; the
    default split is train; a split it lacks is one line naming those it has."""
    import json

    from data_prep.sources import open_source

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "corpus"
    (folder / "data").mkdir(parents=True)
    for split, texts in (("train", ["one", "two"]), ("validation", ["held out"])):
        (folder / "data" / f"{split}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    assert list(open_source(f"hf:{folder}:validation")) == ["held out"]
    assert list(open_source(f"hf:{folder}")) == ["one", "two"]
    with pytest.raises(UsageError) as err:
        list(open_source(f"hf:{folder}:test"))
    assert "\n" not in str(err.value) and "test" in str(err.value)


def test_tiktoken_downloads_into_a_private_cache_only(monkeypatch, tmp_path):
    """tiktoken's own default cache, /tmp/data-gym-cache, is a name anyone may have made first (a FIFO there
    hung prep): unset, the cache is a directory of the user's own; set, one others can write is refused."""
    tiktoken = pytest.importorskip("tiktoken")
    import tempfile

    seen = []

    def offline(name):
        seen.append(os.environ["TIKTOKEN_CACHE_DIR"])
        raise ConnectionError("no route to host")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    with pytest.raises(UsageError):
        tk.build("tiktoken:gpt2")
    assert seen and os.path.dirname(seen[0]) == str(tmp_path) and os.stat(seen[0]).st_mode & 0o077 == 0
    assert "TIKTOKEN_CACHE_DIR" not in os.environ

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(shared))
    with pytest.raises(UsageError) as err:
        tk.build("tiktoken:gpt2")
    assert "TIKTOKEN_CACHE_DIR" in str(err.value) and "group" in str(err.value) and "\n" not in str(err.value)
    assert len(seen) == 1  # refused before tiktoken looked there
