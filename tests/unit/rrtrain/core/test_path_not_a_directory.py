"""A path with a file where a directory belongs (`--out ~/w/afile/res`, afile a regular file) can never be made: the
private-path check said nothing of it ("still to be made"), so a command did all its work and failed at the end.
It is refused up front in its own words, "... is not a directory", not as a question of who can write it.
Budget: milliseconds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rrtrain.core import files
from rrtrain.core.errors import UsageError


def test_a_file_on_the_way_is_not_a_directory(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    os.chmod(afile, 0o600)
    assert files.private_path_problem(afile / "res" / "deeper") == f"'{afile}' {files.NOT_A_DIRECTORY}"
    assert files.prepare_private_dir(afile / "res") == f"'{afile}' {files.NOT_A_DIRECTORY}"
    link = tmp_path / "link"
    link.symlink_to(afile)  # a link to a file on the way: the same
    assert files.private_path_problem(link / "res") == f"'{link}' {files.NOT_A_DIRECTORY}"
    with pytest.raises(UsageError) as got:
        files.check_private_path(afile / "res", "--out")
    message = str(got.value)
    assert message == f"--out: '{afile}' {files.NOT_A_DIRECTORY}" and files.PRIVATE_RULE not in message, message
    assert files.private_path_problem(afile) is None  # a file itself (what a file path names) is fine
    assert files.private_path_problem(tmp_path / "missing" / "res") is None  # still to be made
