"""The fast tier's guard (tests/tiers.py): which subprocesses `make test-fast` refuses, and that a test starting
one fails there, whatever it does with exceptions. Runtime: about 3 s."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import tiers
from trainutil import REPO

PY = sys.executable


@pytest.mark.parametrize("argv", [
    [PY, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "x"],
    ["torchrun", "--standalone"],
    ["/ms-playwright/chromium-1/chrome-linux/chrome", "--headless"],
    [PY, "-m", "playwright", "install", "chromium"],
    [PY, "-P", "/repo/launchers/executors/warm.py", "rrtrain.train", "5", "torch"],
])
def test_torchrun_the_warm_interpreter_and_browsers_are_refused(argv):
    assert tiers.forbidden(argv) is not None


def test_the_installed_slurm_is_refused_and_a_stand_in_is_not(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "squeue"
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    env = {"PATH": str(bin_dir)}
    assert tiers.forbidden(["squeue", "-h"], env) is None  # a test's stand-in, in the temporary folder
    assert tiers.forbidden(["squeue"], {"PATH": "/nonexistent"}) is None  # nothing to start
    monkeypatch.setattr(tiers.tempfile, "gettempdir", lambda: "/nonexistent-tmp")  # the same file, as installed
    assert "Slurm" in tiers.forbidden(["squeue", "-h"], env)


@pytest.mark.parametrize("argv", [
    [PY, "-m", "rrtrain.train", "configs/train/tiny.yaml"],
    [PY, "-c", "import runpy; runpy.run_module('rrtrain.train', run_name='__main__')"],
    [PY, "-m", "rrtrain", "train", "c.yaml"],
    [PY, "-m", "rrtrain", "sweep", "s.yaml", "--out", "o"],
    ["/work/.venv/bin/rrtrain", "demo"],
])
def test_training_starts_are_recognised(argv):
    assert tiers.training(argv) is not None and tiers.forbidden(argv) is None


@pytest.mark.parametrize("argv", [
    [PY, "-m", "rrtrain", "prep", "--source", "synthetic:stories"],
    [PY, "-m", "rrtrain", "sweep", "s.yaml", "--out", "o", "--dry-run"],
    [PY, "-m", "rrtrain", "sweep", "--cancel-flagged", "sweep"],
    [PY, "-m", "rrtrain", "status", "sweep", "--json"],
    [PY, "-c", "import rrtrain.train as t; from rrtrain.training.checkpoint import CheckpointManager"],
    ["bash", "-n", "job.sh"],
    ["sleep", "120"],
    [PY, "-P", "/repo/launchers/executors/warm.py", "probe", "5"],
    b"true",
])
def test_ordinary_subprocesses_are_neither(argv):
    assert tiers.training(argv) is None and tiers.forbidden(argv) is None


def test_a_test_that_starts_training_fails_in_the_fast_tier_only(tmp_path):
    tests = REPO / "tests"
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(tests)!r})\nimport pytest, tiers\n\n"
        "def pytest_configure(config):\n    if tiers.fast_tier():\n        tiers.install_guard()\n\n"
        "@pytest.fixture(autouse=True)\ndef guard():\n    yield\n    if tiers.fast_tier():\n"
        "        tiers.check_launches()\n")
    # a torchrun by its name (the guard's other form, `python -m torch.distributed.run`, is refused above) that
    # leaves a mark when it runs: the full tier starts it, the fast tier never does (and no torch is imported)
    torchrun = tmp_path / "bin" / "torchrun"
    torchrun.parent.mkdir()
    torchrun.write_text('#!/bin/sh\ntouch "$0.ran"\n')
    torchrun.chmod(0o755)
    (tmp_path / "test_launch.py").write_text(
        "import subprocess, sys\n\n"
        "RUNPY = 'import runpy, sys; runpy.run_module(\"rrtrain.train\") if False else sys.exit(int(sys.argv[1]))'\n\n"
        "def test_a_refused_start_is_allowed():\n"
        "    assert subprocess.run([sys.executable, '-c', RUNPY, '2']).returncode == 2\n\n"
        "def test_a_start_that_runs_is_not():\n"
        "    subprocess.run([sys.executable, '-c', RUNPY, '0'])\n\n"
        "def test_torchrun_is_not_even_started():\n"
        "    try:\n"
        f"        subprocess.run([{str(torchrun)!r}, '--help'])\n"
        "    except Exception:\n"
        "        pass\n")

    def run(tier: str) -> subprocess.CompletedProcess:
        """The dummy tests under pytest alone: no installed plugin is loaded (they cost the interpreter seconds of
        imports, and the guard is the conftest's; the options of whoever runs the suite, PYTEST_ADDOPTS, neither)."""
        return subprocess.run([PY, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-c",
                               str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, tiers.TIER_ENV: tier, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                                   "PYTEST_ADDOPTS": ""})

    fast = run("fast")
    assert "2 passed, 1 error" in fast.stdout, fast.stdout[-3000:]  # the run: at its end; torchrun: at once
    assert "test_a_start_that_runs_is_not" in fast.stdout and "started rrtrain.train (exit 0)" in fast.stdout
    assert "FAILED test_launch.py::test_torchrun_is_not_even_started" in fast.stdout
    assert not (tmp_path / "bin" / "torchrun.ran").exists()
    full = run("")
    assert (tmp_path / "bin" / "torchrun.ran").exists()
    assert full.returncode == 0 and "3 passed" in full.stdout, full.stdout[-2000:]
