"""Benchmarks are named bench_*.py so that `make test` (tests/unit, distributed, e2e, slurm) never runs them;
this collects them when pytest is pointed at tests/benchmarks (`make bench`)."""

from __future__ import annotations

import pytest


def pytest_collect_file(parent: pytest.Collector, file_path):
    if file_path.suffix == ".py" and file_path.name.startswith("bench_"):
        return pytest.Module.from_parent(parent, path=file_path)
    return None
