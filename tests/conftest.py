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
    """Under `make test` (pytest-xdist, two workers) the Slurm tests share one local cluster: they form one
    group, run by one worker in order, and come first, so that their long chain of scheduler waits overlaps
    the rest of the suite on the other worker."""
    slurm = [item for item in items if Path(item.path).resolve().is_relative_to(SLURM_TESTS)]
    for item in slurm:
        item.add_marker(pytest.mark.xdist_group("slurm"))
    others = [item for item in items if item not in slurm]
    items[:] = slurm + others
