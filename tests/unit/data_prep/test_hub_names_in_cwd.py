"""A Hugging Face Hub name is a Hub name: `--source hf:OWNER/NAME` and `--tokenizer hf:NAME` were looked up first as
paths relative to the working directory (datasets.load_dataset, the tokenizer loader), so a co-tenant who can write
the directory the user runs from chose the training data and the tokenizer. Where a path of that name is there, the
name is refused in one line before anything is loaded or downloaded; the local one is read when named as one
(./NAME or absolute). Budget: well under 1 s (no dataset loaded, a 258-token tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_prep import tokenizer as tk
from data_prep.sources import HFDataset, open_source
from rrtrain.core.errors import UsageError


def refused(call, name: str) -> None:  # noqa: ANN001 - a call that would read `name` from the working directory
    with pytest.raises(UsageError) as got:
        call()
    message = str(got.value)
    assert "\n" not in message and "Hub name" in message and f"./{name}" in message, message


def test_a_hub_dataset_name_that_is_a_path_here_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the shared directory the user runs from: the co-tenant planted the "dataset"
    planted = tmp_path / "roneneldan" / "TinyStories"
    planted.mkdir(parents=True)
    (planted / "train.jsonl").write_text('{"text": "planted story"}\n')
    refused(lambda: list(open_source("hf:roneneldan/TinyStories")), "roneneldan/TinyStories")
    refused(lambda: open_source("hf:roneneldan/TinyStories:train"), "roneneldan/TinyStories")
    # named as a local path, it is one (and is read through the checks of every local source)
    for name in ("./roneneldan/TinyStories", str(planted)):
        assert isinstance(open_source(f"hf:{name}"), HFDataset)
    # a name with no path of it here is left to the Hub, as before; a path the Hub cannot mean is a path
    assert isinstance(open_source("hf:someone/else"), HFDataset)
    assert isinstance(open_source("hf:roneneldan/TinyStories/sub"), HFDataset)


def test_a_hub_tokenizer_name_that_is_a_path_here_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    bpe = tk.train_bpe(258, iter(["a planted tokenizer"] * 4))
    for planted in (tmp_path / "gpt2", tmp_path / "owner" / "tok"):
        planted.mkdir(parents=True)
        bpe.save(str(planted))
    refused(lambda: tk.build("hf:gpt2"), "gpt2")
    refused(lambda: tk.build("hf:owner/tok"), "owner/tok")
    assert tk.vocab_estimate("hf:./owner/tok") == tk.build("hf:./owner/tok").vocab_size == 258
    assert tk.build(f"hf:{tmp_path / 'owner' / 'tok'}").vocab_size == 258
    assert tk.build("hf:owner/tok/tokenizer.json").vocab_size == 258  # a .json file is never a Hub name
