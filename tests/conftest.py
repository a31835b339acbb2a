"""Fixtures shared across the test suite."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# Tiny models on 2 shared cores run faster on one thread; subprocesses get OMP_NUM_THREADS=1 (trainutil.env).
torch.set_num_threads(1)

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainutil import prep_stories  # noqa: E402


@pytest.fixture(scope="session")
def stories_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level synthetic-stories dataset (seq_len 64), prepared once per test session."""
    return prep_stories(tmp_path_factory.mktemp("data") / "stories")


SLURM_TESTS = Path(__file__).resolve().parent / "slurm"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `make test` (pytest-xdist, three workers) the tests that use the local Slurm cluster share it: they
    form one group, run by one worker in order. tests/slurm comes first, so that the group's long chain of
    scheduler waits overlaps the rest of the suite on the other worker; its tests that need no cluster (the
    LocalExecutor, the rendezvous) stay out of the group. Every other test goes with the rest of its file: a
    module's fixtures (a sweep trained for the dashboard, an HSDP run) are then built once, not once per worker,
    and a file with a test on the cluster goes to the group whole."""
    in_slurm = {item.nodeid: Path(item.path).resolve().is_relative_to(SLURM_TESTS) for item in items}
    on_cluster = {item.path for item in items if "cluster_session" in getattr(item, "fixturenames", ())}
    for item in items:  # a file with one test on the cluster goes whole: its other tests share its fixtures
        item.add_marker(pytest.mark.xdist_group("slurm" if item.path in on_cluster else Path(item.path).stem))
    items[:] = [item for item in items if in_slurm[item.nodeid]] + [item for item in items if not in_slurm[item.nodeid]]
