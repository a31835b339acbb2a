"""The session's Slurm cluster: one cluster of NODES nodes (slurm/local/start.sh --nodes 2, which installs Slurm
when it is missing), shared by every test of this directory, single-node jobs included (they run on either
node), stopped at the end when this session started it. The tests skip, with the reason, only where the
cluster cannot be started at all; under CI (env CI set) that is a failure instead.

Each node has its own /tmp (a mount namespace), as on a real cluster: a job cannot see pytest's usual
temporary directories. So here `tmp_path` and `stories_data` live on the machine's shared file system
(SHARED, outside /tmp), visible to every node, and are removed when the session ends."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from slurmutil import NODES, SESSION_LOCK, START, STATE, STOP  # noqa: E402

SHARED = Path(os.environ.get("RRTRAIN_SLURM_SHARED", "/var/tmp/rrtrain-slurm-tests"))


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
def cluster_session() -> Iterator[None]:
    """This session's hold on the machine's one local cluster: a second pytest session (or a second xdist
    worker, were the Slurm tests not kept on one) would restart and stop it under the first one's jobs."""
    STATE.parent.mkdir(parents=True, exist_ok=True)
    with open(SESSION_LOCK, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pytest.fail(f"another test session holds the local Slurm cluster ({SESSION_LOCK}); the "
                        "Slurm tests run in one session (and on one xdist worker: tests/conftest.py) at a time",
                        pytrace=False)
        yield


@pytest.fixture(scope="session")
def slurm_cluster(cluster_session: None) -> Iterator[Path]:
    """The cluster's slurm.conf; SLURM_CONF is exported for the session so every subprocess finds it."""
    if os.geteuid() != 0:
        _unavailable("slurm/local/start.sh needs root")
    was_running = _running()
    try:
        proc = subprocess.run(["bash", str(START), "--nodes", str(NODES)], capture_output=True, text=True,
                              timeout=900)
    except subprocess.TimeoutExpired:
        subprocess.run(["bash", str(STOP)], capture_output=True, timeout=120)
        _unavailable("slurm/local/start.sh took longer than 900 s")
    if proc.returncode != 0:
        _unavailable(f"slurm/local/start.sh exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    conf = STATE / "slurm.conf"
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    try:
        yield conf
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        if not was_running:
            subprocess.run(["bash", str(STOP)], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def shared_root() -> Iterator[Path]:
    """This session's directory on the file system every node shares."""
    SHARED.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="session-", dir=SHARED))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tmp_path(shared_root: Path, request: pytest.FixtureRequest) -> Path:
    """A fresh directory per test, on the shared file system (a node's /tmp is its own)."""
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in request.node.name)[:60]
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared_root))


@pytest.fixture(scope="session")
def stories_data(stories_data: Path, shared_root: Path) -> Path:
    """The session's dataset, copied where every node can read it."""
    return Path(shutil.copytree(stories_data, shared_root / "data" / "stories"))
