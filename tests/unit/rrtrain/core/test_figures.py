"""matplotlib reads `./matplotlibrc` as it is first imported and opens whatever is at that name: a co-tenant's
FIFO there hung `rrtrain report` and `rrtrain coordcheck`, a link to /dev/zero filled memory, `text.usetex` ran
LaTeX. rrtrain.core.figures, the one importer of matplotlib (tests/unit/repository/test_import_layers.py), imports
it with `/` as the working directory and gives the working directory back. Budget: ~3 s (fresh interpreters)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rrtrain.core import files
from trainutil import env

READ = ("import os, rrtrain.core.figures, matplotlib; "
        "print(matplotlib.rcParams['text.usetex'], os.getcwd())")


@pytest.mark.parametrize("plant", ["fifo", "usetex"])
def test_the_working_directorys_matplotlibrc_is_never_opened(plant: str, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    rc = shared / "matplotlibrc"
    if plant == "fifo":
        os.mkfifo(rc)  # opened, it waits for a writer that never comes
    else:
        rc.write_text("text.usetex: True\n")
    res = subprocess.run([sys.executable, "-P", "-c", READ], cwd=shared, env=env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["False", str(shared)]


def test_working_in_returns_to_the_directory_it_left_even_renamed(tmp_path: Path) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    before = os.getcwd()
    os.chdir(here)
    try:
        with files.working_in(there):
            assert os.getcwd() == str(there)
            os.rename(here, tmp_path / "moved")
        assert os.getcwd() == str(tmp_path / "moved")
    finally:
        os.chdir(before)
