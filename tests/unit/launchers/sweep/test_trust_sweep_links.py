"""`rrtrain sweep` on a sweep file, or into a sweep directory, that is a loop of symbolic links: one line, exit 2
(before, pathlib's `RuntimeError: Symlink loop` escaped as a traceback). Budget: under a second (in process)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launchers.sweep import spec
from rrtrain.cli.main import main as cli
from rrtrain.core.errors import UsageError
from trainutil import REPO


def loop(where: Path, name: str) -> Path:
    """`name` -> `name.other` -> `name`: a loop of two links."""
    (where / f"{name}.other").symlink_to(where / name)
    (where / name).symlink_to(where / f"{name}.other")
    return where / name


def test_a_sweep_file_that_is_a_loop_of_links_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sweep_file = loop(tmp_path, "sweep.yaml")
    with pytest.raises(UsageError, match="a loop of symbolic links"):
        spec.load(sweep_file)
    assert cli(["sweep", str(sweep_file), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rrtrain sweep: error: ") and "\n" not in err and "sweep.yaml" in err, err


def test_a_sweep_directory_that_is_a_loop_of_links_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = loop(tmp_path, "out")
    assert cli(["sweep", str(REPO / "configs" / "sweeps" / "demo.yaml"), "--out", str(out), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rrtrain sweep: error: ") and "\n" not in err and "a loop of symbolic links" in err, err
