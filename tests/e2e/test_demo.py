"""`rrtrain demo` end to end through `rrtrain sweep` (the local executor): the demo's sweep file, all 14 runs at
its three sizes, with fewer steps, so that what the suite checks is the demo's path rather than its training:
the data prepared by the sweep, progress while it runs, the monitor stopping a stalled run, the report's table,
the flagged runs with their reasons, the plots, the TensorBoard logdir and the dashboard command.

Which run stalls is decided here, not learned: `review_convex` at 40 sublayers is given a learning rate of 1e-7
(a model that stays where it started, its loss far above the unigram entropy, as in
tests/e2e/test_monitor_train.py) and a plateau test from step 10, so the monitor stops it within a few steps of
step 10 whatever the machine. That the real demo stops the real convex run at 40 sublayers, and no other run, is
a matter of 120-150 steps of training: `tests/benchmarks/bench_demo.py` runs `make demo`'s exact sweep and
asserts it (about 200 CPU-s on 2 cores against about 50 here); a stall in training that moves is asserted in the
suite by the depth study at 20 sublayers (tests/unit/rrtrain/planning/test_depth_study.py). The timeout only
stops a hang."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from trainutil import PY, REPO, env

pytestmark = pytest.mark.slow

SHORT = 10  # steps of the micro and tiny runs here (150 in the demo)
DEEP = 20  # steps of the 40-sublayer pair here (120 in the demo)
CONVEX = "tiny-deep-review_convex-s0"
FLAT = {"train.lr": "1e-7", "monitor.min_steps": "10", "monitor.window": "10"}  # stalled at step 10, by construction


def test_demo_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    overrides = [*(f"sizes.{size}.overrides.train.max_steps={SHORT}" for size in ("micro", "tiny")),
                 f"sizes.tiny-deep.overrides.train.max_steps={DEEP}",
                 *(f"runs.{CONVEX}.{key}={value}" for key, value in FLAT.items())]
    proc = subprocess.run([PY, "-m", "rrtrain", "demo", "--out", str(out), "--parallel", "2", "--interval", "3",
                           *overrides], capture_output=True, text=True, env=env(), cwd=REPO, timeout=1800)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-6000:]

    finals = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/final.json")}
    assert len(finals) == 14, sorted(finals)  # 3 variants x 2 sizes x 2 seeds, and review / review_convex deep
    convex = finals.pop(CONVEX)
    assert convex["status"] == "stalled" and convex["step"] < DEEP and convex["exit_code"] == 4, convex
    assert {f["status"] for f in finals.values()} == {"completed"}, {k: f["status"] for k, f in finals.items()}
    assert finals["tiny-deep-review-s0"]["step"] == DEEP
    assert {f["step"] for k, f in finals.items() if not k.startswith("tiny-deep")} == {SHORT}
    assert not [k for k, f in finals.items() if f["flags"]], {k: f["flags"] for k, f in finals.items()}

    assert "runs done" in text and "time left" in text  # progress while it ran
    assert "\n| " in proc.stdout and "review" in proc.stdout  # the report's table
    flagged = proc.stdout.split("flagged runs:", 1)[1]
    assert f"{CONVEX} [stalled]" in flagged and "stalled: smoothed loss" in flagged
    assert f"rrtrain dashboard {out}" in proc.stdout

    report = out / "report"
    for name in ("report.md", "results.csv", "summary.json"):
        assert (report / name).stat().st_size > 0, name
    plots = list(report.glob("*.png"))
    assert plots and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in plots)
    logdir = out / ".dashboard" / "logdir"
    assert logdir.is_dir() and str(logdir) in proc.stdout
    assert (logdir / "tiny-deep" / "review_convex").is_dir()
