"""`tests/benchmarks/gpu_coordcheck.sh` on CPU (ALLOW_CPU=1, tiny shapes): the coordinate check a lent GPU runs
unattended. Everything but the GPU is exercised: the interpreter choice, the checks in one process, the
per-check headline and the table, and a check that fails (a rule completep refuses) reported while the others go
on, with exit status 1. Runtime: one process, one two-width check at d_model 32-64 and one refused, ~10 s of CPU.
"""

from __future__ import annotations

import json

import pytest

from trainutil import PY, REPO, env

SCRIPT = REPO / "tests" / "benchmarks" / "gpu_coordcheck.sh"


@pytest.mark.slow  # a subprocess: the interpreter, torch and one two-width check
def test_gpu_coordcheck_script_measures_and_reports_on_cpu(tmp_path):
    import subprocess

    out = tmp_path / "cc"
    e = {**env(), "ALLOW_CPU": "1", "PYTHON": PY, "VARIANT": "deepnorm", "BASE": "micro", "WIDTHS": "32 64",
         "WIDTH_PARAMS": "mup", "DEPTHS": "1 2", "DEPTH_PARAMS": "completep", "STEPS": "1", "BATCH": "2", "SEQ": "16",
         "OUT": str(out), "TIME_LIMIT": "200"}
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=e, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]  # the refused check did not run
    text = proc.stdout
    assert "deepnorm at micro's shape (d_model 48, 2 blocks, 4 heads)" in text
    assert "h_delta (mup, last block, step 1): 32: " in text
    assert "| width | mup | 32: " in text
    assert "not measured: depth completep (1 2): exit status 2" in text
    assert "refuses residual rule 'deepnorm'" in proc.stderr
    assert "1 of 2 checks" in text
    records = json.loads((out / "width-mup" / "coordcheck.json").read_text())
    assert {(r["width"], r["parametrization"]) for r in records} == {(32, "mup"), (64, "mup")}
    assert not (out / "depth-completep").exists()
