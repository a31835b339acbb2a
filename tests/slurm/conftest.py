"""The session's one-node Slurm cluster: started by slurm/local/start.sh (which installs Slurm when it is
missing), stopped at the end when this session started it. The tests skip, with the reason, only where the
cluster cannot be started at all; under CI (env CI set) that is a failure instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from slurmutil import START, STOP  # noqa: E402

STATE = Path(os.environ.get("RRTRAIN_SLURM_DIR", "/var/tmp/rrtrain-slurm"))


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the local Slurm cluster must start under CI: {reason}", pytrace=False)
    pytest.skip(f"no local Slurm cluster: {reason}")


def _running() -> bool:
    pid = STATE / "slurmctld.pid"
    try:
        os.kill(int(pid.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Path]:
    """The cluster's slurm.conf; SLURM_CONF is exported for the session so every subprocess finds it."""
    if os.geteuid() != 0:
        _unavailable("slurm/local/start.sh needs root")
    was_running = _running()
    try:
        proc = subprocess.run(["bash", str(START)], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        _unavailable("slurm/local/start.sh took longer than 900 s")
    if proc.returncode != 0:
        _unavailable(f"slurm/local/start.sh exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    conf = STATE / "slurm.conf"
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    yield conf
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
    if not was_running:
        subprocess.run(["bash", str(STOP)], capture_output=True, timeout=120)
