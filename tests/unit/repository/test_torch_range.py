"""torch is a range in pyproject.toml, not one pinned version (a cluster's own CUDA build of torch must not be
replaced by an install), and its floor is the version this suite runs with."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[3]
FLOOR = Version("2.14.1")  # the torch the suite is run with; README's install section names it


def test_torch_is_a_range_whose_floor_is_the_tested_version():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    [torch_req] = [Requirement(d) for d in deps if Requirement(d).name == "torch"]
    assert not any(s.operator in ("==", "===", "~=") for s in torch_req.specifier), torch_req
    assert {s.operator: Version(s.version) for s in torch_req.specifier}.get(">=") == FLOOR, torch_req
    assert torch_req.specifier.contains("2.15.0") and not torch_req.specifier.contains("2.13.0")
    assert Version(torch.__version__.split("+")[0]) in torch_req.specifier
    assert f"torch>={FLOOR}" in (REPO / "README.md").read_text()
