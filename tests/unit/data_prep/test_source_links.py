"""A directory source (`rrtrain prep --source DIR`) is read only through its own regular files: a symbolic link in
it, to a file or to a directory, is refused in one line naming it (a co-tenant's srcdir with `b.jsonl ->
~alice/secret.jsonl` would otherwise tokenize alice's secret into her dataset), and each file is opened beneath
the directory with no link followed. Budget: well under 1 s (the readers alone, in process)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from data_prep.sources import Directory, file_source, open_source
from prep_helpers import prep
from rrtrain.core.errors import UsageError


@pytest.fixture
def srcdir(tmp_path: Path) -> Path:
    """mallory's source directory, and alice's private secret outside it."""
    secret = tmp_path / "alice" / "secret.jsonl"
    secret.parent.mkdir(mode=0o700)
    secret.write_text(json.dumps({"text": "alice's secret"}) + "\n")
    src = tmp_path / "srcdir"
    src.mkdir()
    (src / "a.jsonl").write_text(json.dumps({"text": "a public story"}) + "\n")
    return src


def refused(source, *words: str) -> str:  # noqa: ANN001 - a source
    with pytest.raises(UsageError) as got:
        list(source)
    message = str(got.value)
    assert "\n" not in message and all(w in message for w in words), message
    return message


def test_a_link_to_a_file_outside_is_refused_naming_it(srcdir: Path, tmp_path: Path) -> None:
    assert list(open_source(str(srcdir))) == ["a public story"]
    (srcdir / "b.jsonl").symlink_to(tmp_path / "alice" / "secret.jsonl")
    message = refused(open_source(str(srcdir)), str(srcdir / "b.jsonl"), "symbolic link")
    assert "secret" not in message.replace(str(srcdir / "b.jsonl"), "")


def test_prep_refuses_it_in_one_line_and_writes_nothing(srcdir: Path, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    (srcdir / "b.jsonl").symlink_to(tmp_path / "alice" / "secret.jsonl")
    assert prep("--source", str(srcdir), "--out", str(tmp_path / "ds"), "--tokenizer", "byte", "--seq-len", "8") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "b.jsonl" in err and "symbolic link" in err, err
    assert not (tmp_path / "ds").exists()


def test_a_link_to_a_directory_is_refused_too(srcdir: Path, tmp_path: Path) -> None:
    (srcdir / "more").symlink_to(tmp_path / "alice")
    refused(open_source(str(srcdir)), str(srcdir / "more"), "symbolic link")


def test_a_link_swapped_in_after_listing_is_not_followed(srcdir: Path, tmp_path: Path) -> None:
    source = Directory(str(srcdir))
    listed = source.files()  # listed while a.jsonl was a regular file
    os.unlink(srcdir / "a.jsonl")
    (srcdir / "a.jsonl").symlink_to(tmp_path / "alice" / "secret.jsonl")
    refused(file_source(listed[0], "blank", "text", root=str(srcdir)), "a.jsonl")


def test_links_the_source_does_not_read_are_left_alone(srcdir: Path, tmp_path: Path) -> None:
    (srcdir / "README").symlink_to(tmp_path / "alice" / "secret.jsonl")  # not a corpus file: never opened
    (srcdir / ".hidden.jsonl").symlink_to(tmp_path / "alice" / "secret.jsonl")
    assert list(open_source(str(srcdir))) == ["a public story"]
