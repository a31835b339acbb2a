"""`rrtrain prep --bos`: a beginning-of-document token before every document, where the tokenizer has one;
recorded in the manifest and its fingerprint; a tokenizer without one is one line, exit 2, nothing written."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from data_prep import tokenizer as tk
from data_prep.cli import options_from_args
from data_prep.options import PrepOptions
from data_prep.synthetic import StoryCorpus
from prep_helpers import prep, read_split
from rrtrain.core.errors import UsageError
from rrtrain.data.manifest import read_manifest
from rrtrain.data.verify import dataset_problems

ARGS = ("--seq-len", "16", "--val-fraction", "0.1", "--min-val-samples", "4")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("bos") / "c.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in StoryCorpus(40, seed=5)), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory, corpus) -> dict[str, str]:
    """tokenizer.json directories: a bpe that reserves <|startoftext|>, and one with <|endoftext|> alone."""
    texts = list(StoryCorpus(40, seed=5))
    out = {}
    for name, bos in (("with_bos", True), ("without_bos", False)):
        d = tmp_path_factory.mktemp(name)
        tk.train_bpe(300, iter(texts), bos=bos).save(str(d))
        out[name] = str(d)
    return out


def test_bos_goes_before_every_document_and_into_the_fingerprint(tmp_path, corpus, tokenizers):
    tok = f"hf:{tokenizers['with_bos']}"
    assert prep("--source", corpus, "--tokenizer", tok, "--out", str(tmp_path / "bos"), "--bos", *ARGS) == 0
    assert prep("--source", corpus, "--tokenizer", tok, "--out", str(tmp_path / "plain"), *ARGS) == 0
    with_bos, plain = read_manifest(str(tmp_path / "bos")), read_manifest(str(tmp_path / "plain"))
    assert with_bos["bos_id"] == 1 and with_bos["eos_id"] == 0 and "bos_id" not in plain
    assert with_bos["fingerprint"] != plain["fingerprint"]
    assert not list(dataset_problems(str(tmp_path / "bos"), with_bos))  # `prep --verify` and every run accept it
    stream = read_split(tmp_path / "bos", "train").ravel()
    after_eos = stream[1:][stream[:-1] == 0]
    assert len(after_eos) > 3 and np.all(after_eos == 1)  # each next document opens with BOS
    assert int((stream == 1).sum()) >= int((stream == 0).sum()) - 1


@pytest.mark.parametrize("tokenizer,extra,message", [
    ("byte", (), "--bos: tokenizer 'byte' has no beginning-of-document token"),
    ("tiktoken:gpt2", (), "--bos: tokenizer 'tiktoken:gpt2' has no beginning-of-document token"),
    ("without_bos", (), "has no beginning-of-document token (none of <|begin_of_text|>"),
    ("with_bos", ("--bos-token", "<nope>"), "has no token '<nope>'"),
])
def test_a_tokenizer_without_bos_is_refused_with_nothing_written(tmp_path, capsys, corpus, tokenizers,
                                                                tokenizer, extra, message):
    spec = f"hf:{tokenizers[tokenizer]}" if tokenizer in tokenizers else tokenizer
    out = tmp_path / "out"
    assert prep("--source", corpus, "--tokenizer", spec, "--out", str(out), "--bos", *extra, *ARGS) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rrtrain prep: error: ") and message in err and "\n" not in err, err
    assert os.listdir(tmp_path) == []  # no OUT, no staging directory


def test_bos_options_round_trip_and_bos_token_needs_bos():
    opts = PrepOptions(source="s.txt", out="o", bos=True, bos_token="<s>")
    assert options_from_args(opts.argv()) == opts
    with pytest.raises(UsageError, match="--bos-token names the token --bos adds: give --bos too"):
        PrepOptions(source="s.txt", out="o", bos_token="<s>").validate()


def test_bos_that_is_the_eos_is_refused(tmp_path):
    texts = list(StoryCorpus(20, seed=6))
    tok = tk.train_bpe(280, iter(texts))
    with pytest.raises(UsageError, match="is its end-of-document token too"):
        tk.find_bos(tok, "<|endoftext|>")
    assert tk.find_bos(tk.train_bpe(280, iter(texts), bos=True)) == 1
