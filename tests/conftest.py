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
