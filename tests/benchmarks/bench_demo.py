"""`make demo`'s sweep as shipped (`rrtrain demo --parallel 2`, no overrides): the outcome the demo exists to
show, and what it costs. The suite's tests/e2e/test_demo.py runs the same sweep with fewer steps and a stall
decided by its settings; whether the real convex run at 40 sublayers stalls, and no other run does, takes the
demo's 120-150 steps of training, so it is asserted here.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks/bench_demo.py   (or `make bench`)

Asserted: `tiny-deep-review_convex-s0` is stopped by the monitor as stalled before its 120 steps, every other
run completes unflagged, and `tiny-deep-review-s0` ends below the corpus's unigram entropy. Printed: the wall
time and the CPU time of the demo and everything it started (RUSAGE_CHILDREN of this process), and each run's
outcome and held-out loss.
"""

from __future__ import annotations

import json
import resource
import subprocess
import time
from pathlib import Path

from trainutil import PY, REPO, env

CONVEX, ADDITIVE = "tiny-deep-review_convex-s0", "tiny-deep-review-s0"
DEEP_STEPS = 120  # configs/sweeps/demo.yaml's budget at tiny-deep


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_the_shipped_demo_stops_the_convex_run_and_no_other(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    cpu0, t0 = children_cpu(), time.monotonic()
    proc = subprocess.run([PY, "-m", "rrtrain", "demo", "--out", str(out), "--parallel", "2"],
                          capture_output=True, text=True, env=env(), cwd=REPO, timeout=3600)
    wall, cpu = time.monotonic() - t0, children_cpu() - cpu0
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]

    finals = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/final.json")}
    entropy = json.loads((out / "data" / "manifest.json").read_text())["unigram_entropy"]
    print(f"\nrrtrain demo --parallel 2: {wall:.0f} s wall, {cpu:.0f} CPU-s; unigram entropy {entropy:.3f}")
    print("| run | outcome | step | final validation loss |\n|---|---|---|---|")
    for name, f in sorted(finals.items()):
        loss = f.get("final_val_loss")
        print(f"| {name} | {f['status']} | {f['step']} | {loss:.3f} |" if isinstance(loss, (int, float))
              else f"| {name} | {f['status']} | {f['step']} | - |")
    assert len(finals) == 14, sorted(finals)
    convex = finals.pop(CONVEX)
    assert convex["status"] == "stalled" and convex["step"] < DEEP_STEPS, convex
    assert {f["status"] for f in finals.values()} == {"completed"}, {k: f["status"] for k, f in finals.items()}
    assert not [k for k, f in finals.items() if f["flags"]], {k: f["flags"] for k, f in finals.items()}
    assert finals[ADDITIVE]["step"] == DEEP_STEPS and finals[ADDITIVE]["final_val_loss"] < entropy
