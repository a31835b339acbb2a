"""`rrtrain prep --overwrite` never deletes what it reads: OUT that is, or holds, the source (or an `hf:` tokenizer
directory) is refused in one line, exit 2, and nothing moves; a FIFO at OUT/manifest.json does not hang prep.
Budget: about 5 s."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prep_helpers import prep, prep_subprocess, tree

SMALL = ("--tokenizer", "byte", "--seq-len", "16", "--min-val-samples", "2")


@pytest.fixture(scope="module")
def corpus_text() -> str:
    return "".join(f"Story {i}: the cat sat on the mat and looked at the moon for a while.\n\n" for i in range(200))


@pytest.fixture
def out(tmp_path: Path, corpus_text: str) -> Path:
    """OUT holding a dataset, with the corpus it will be rebuilt from beside the dataset's files."""
    out = tmp_path / "OUT"
    assert prep("--source", "synthetic:stories", "--num-docs", "60", "--out", str(out), *SMALL) == 0
    (out / "corpus.txt").write_text(corpus_text)
    return out


def test_a_source_inside_out_is_refused_and_nothing_moves(out, capsys):
    before = tree(out)
    assert prep("--source", str(out / "corpus.txt"), "--out", str(out), "--overwrite", *SMALL) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "holds the input" in err and "corpus.txt" in err
    assert tree(out) == before  # the corpus and the old dataset are where they were


def test_out_as_the_source_directory_or_through_a_link_is_refused(out, tmp_path, capsys):
    before = tree(out)
    assert prep("--source", str(out), "--out", str(out), "--overwrite", *SMALL) == 2
    (tmp_path / "elsewhere").symlink_to(out)  # the source named through a link: both sides are resolved
    assert prep("--source", str(tmp_path / "elsewhere" / "corpus.txt"), "--out", str(out), "--overwrite", *SMALL) == 2
    (tmp_path / "out-link").symlink_to(out)
    assert prep("--source", str(out / "corpus.txt"), "--out", str(tmp_path / "out-link"), "--overwrite", *SMALL) == 2
    assert capsys.readouterr().err.count("holds the input") == 3
    assert tree(out) == before


def test_an_hf_tokenizer_directory_inside_out_is_refused(out, tmp_path, capsys):
    (out / "tok").mkdir()
    (tmp_path / "corpus.txt").write_text((out / "corpus.txt").read_text())
    assert prep("--source", str(tmp_path / "corpus.txt"), "--tokenizer", f"hf:{out / 'tok'}", "--out", str(out),
                "--overwrite", "--seq-len", "16") == 2
    assert "holds the input" in capsys.readouterr().err and (out / "tok").is_dir()


def test_a_source_outside_out_still_replaces_it(out, tmp_path, capsys):
    (tmp_path / "corpus.txt").write_text((out / "corpus.txt").read_text())
    before = tree(out)  # the corpus copied out, the old one still beside the dataset: not prep's to delete
    assert prep("--source", str(tmp_path / "corpus.txt"), "--out", str(out), "--overwrite", *SMALL) == 2
    assert "'corpus.txt' is not part of one" in capsys.readouterr().err and tree(out) == before
    (out / "corpus.txt").unlink()  # OUT wholly the dataset: replaced
    assert prep("--source", str(tmp_path / "corpus.txt"), "--out", str(out), "--overwrite", *SMALL) == 0
    assert (out / "manifest.json").is_file()


def test_a_fifo_as_the_manifest_does_not_hang_prep(tmp_path):
    out = tmp_path / "OUT"
    out.mkdir()
    os.mkfifo(out / "manifest.json")
    res = prep_subprocess("--source", "synthetic:stories", "--num-docs", "60", "--out", str(out), "--overwrite",
                          *SMALL, "--quiet", timeout=60)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "holds no rrtrain dataset" in res.stderr and res.stderr.strip().count("\n") == 0
    assert (out / "manifest.json").is_fifo()
