"""`rrtrain prep --overwrite` replaces only what a dataset consists of: a copied manifest.json (any JSON with
format_version and fingerprint) proves nothing about the files beside it, so OUT holding anything prep does not
write (a thesis.txt beside the manifest, a note inside a split directory, a link) is refused in one line and
nothing is deleted. Budget: well under 1 s (two tiny preps of the byte tokenizer, in process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from data_prep.atomic import dataset_problem, holds_dataset
from prep_helpers import prep, tree

PREP = ("--source", "synthetic:stories", "--num-docs", "30", "--tokenizer", "byte", "--seq-len", "16",
        "--min-val-samples", "2")


def refused(capsys: pytest.CaptureFixture[str], out: Path, *words: str) -> None:
    before = tree(out)
    assert prep(*PREP, "--out", str(out), "--overwrite") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "holds no rrtrain dataset" in err and all(w in err for w in words), err
    assert tree(out) == before


def test_a_copied_manifest_does_not_let_overwrite_delete_the_thesis(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    notes = tmp_path / "notes"
    notes.mkdir(mode=0o700)
    (notes / "thesis.txt").write_text("three years of work")
    (notes / "manifest.json").write_text(json.dumps({"format_version": 1, "fingerprint": "copied"}))
    refused(capsys, notes, "thesis.txt")
    assert (notes / "thesis.txt").read_text() == "three years of work"


def test_anything_beside_a_real_dataset_is_refused_and_the_dataset_alone_is_replaced(tmp_path: Path,
                                                                                      capsys) -> None:  # noqa: ANN001
    data = tmp_path / "data"
    assert prep(*PREP, "--out", str(data)) == 0
    assert dataset_problem(str(data)) is None
    (data / "train" / "notes.txt").write_text("mine")  # inside a split directory
    refused(capsys, data, "train/notes.txt")
    os.unlink(data / "train" / "notes.txt")
    (data / "old").mkdir()  # an empty directory is not prep's either
    refused(capsys, data, "'old'")
    os.rmdir(data / "old")
    (data / "tokenizer.json").symlink_to(tmp_path / "elsewhere")  # a name prep writes, as a link
    refused(capsys, data, "tokenizer.json")
    os.unlink(data / "tokenizer.json")
    assert prep(*PREP, "--out", str(data), "--overwrite", "--seed", "1") == 0  # wholly a dataset: replaced
    assert json.loads((data / "manifest.json").read_text())["seed"] == 1


def test_the_proof_at_deletion_is_the_same_through_the_moved_directorys_descriptor(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert prep(*PREP, "--out", str(data)) == 0
    (data / "thesis.txt").write_text("slipped in after the check")
    fd = os.open(data, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert not holds_dataset(fd)  # replace_dir's `accept`: the old OUT is then kept, not deleted
    finally:
        os.close(fd)
