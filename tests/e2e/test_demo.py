"""`rrtrain demo` end to end through `rrtrain sweep` (the local executor): the demo as `make demo` runs it, with
the steps of its two small sizes cut, so that what it shows is what is asserted: the monitor stops
`review_convex` at 40 sublayers as stalled and every other run completes.

The 40-sublayer pair (`tiny-deep`) runs exactly as in `configs/sweeps/demo.yaml`: whether the convex run stalls
and the additive one does not is a matter of its training, and only the real settings show it (a shorter copy
with the plateau test from step 40 passed while the real demo's monitor stopped a healthy `standard` run still on
the unigram plateau at step 90). `micro` and `tiny` train `SHORT` steps instead of 150 through the demo's own
`key=value` overrides: their outcome does not depend on how far they train (the monitor's plateau test starts at
its default step 200, past their end either way), and their twelve runs were nearly half the demo's CPU time
(measured alone on 2 cores: 234 CPU-s, 2:18, for the demo; 134 CPU-s, 1:23, for this test). Several times that
wall time beside the rest of the suite on a slow host: the timeout only stops a hang."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from trainutil import PY, REPO, env

pytestmark = pytest.mark.slow

CONVEX_STEPS = 120  # configs/sweeps/demo.yaml's budget at tiny-deep
SHORT = 30  # steps of the micro and tiny runs here (150 in the demo)


def test_demo_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run([PY, "-m", "rrtrain", "demo", "--out", str(out), "--parallel", "2", "--interval", "3",
                           *(f"sizes.{size}.overrides.train.max_steps={SHORT}" for size in ("micro", "tiny"))],
                          capture_output=True, text=True, env=env(), cwd=REPO, timeout=1800)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-6000:]

    finals = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/final.json")}
    assert len(finals) == 14, sorted(finals)  # 3 variants x 2 sizes x 2 seeds, and review / review_convex deep
    convex = finals.pop("tiny-deep-review_convex-s0")
    assert convex["status"] == "stalled" and convex["step"] < CONVEX_STEPS, convex
    assert {f["status"] for f in finals.values()} == {"completed"}, {k: f["status"] for k, f in finals.items()}
    assert finals["tiny-deep-review-s0"]["step"] == CONVEX_STEPS  # the pair as the demo trains it
    assert {f["step"] for k, f in finals.items() if not k.startswith("tiny-deep")} == {SHORT}
    assert not [k for k, f in finals.items() if f["flags"]], {k: f["flags"] for k, f in finals.items()}

    assert "runs done" in text and "time left" in text  # progress while it ran
    assert "\n| " in proc.stdout and "review" in proc.stdout  # the report's table
    flagged = proc.stdout.split("flagged runs:", 1)[1]
    assert "tiny-deep-review_convex-s0 [stalled]" in flagged and "stalled: smoothed loss" in flagged
    assert f"rrtrain dashboard {out}" in proc.stdout

    report = out / "report"
    for name in ("report.md", "results.csv", "summary.json"):
        assert (report / name).stat().st_size > 0, name
    plots = list(report.glob("*.png"))
    assert plots and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)
    logdir = out / ".dashboard" / "logdir"
    assert logdir.is_dir() and str(logdir) in proc.stdout
    assert (logdir / "tiny-deep" / "review_convex").is_dir()
