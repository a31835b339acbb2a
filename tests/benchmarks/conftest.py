"""Benchmarks are named bench_*.py so that `make test` (tests/unit, distributed, e2e, slurm) never runs them;
this collects them when pytest is pointed at tests/benchmarks (`make bench`). A file named on the command
line is already collected by pytest itself, so it is left alone here (else it would run twice)."""

from __future__ import annotations

import pytest


def pytest_collect_file(parent: pytest.Collector, file_path):
    if file_path.suffix == ".py" and file_path.name.startswith("bench_") and not parent.session.isinitpath(file_path):
        return pytest.Module.from_parent(parent, path=file_path)
    return None


@pytest.fixture(autouse=True)
def _real_training_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark measures a real `python -m rrtrain.train` (start-up included, its CPU time and peak RSS in
    RUSAGE_CHILDREN), not a child of the tests' fork server (tests/forkserver.py)."""
    monkeypatch.setenv("RRTRAIN_TEST_FORKSERVER", "0")
