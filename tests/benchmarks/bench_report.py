"""What `rrtrain report` costs on a big sweep, and how its memory grows with the number of runs.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks/bench_report.py   # ~3 min

Two fabricated sweeps of runs x 3,000 steps (`bench_live.fabricate`: a training line per step, an evaluation and a
diagnostic line every 100 steps; 500 runs are ~160 MB of metrics.jsonl): 100 runs and 500 runs. Each `rrtrain
report` runs under a small Python parent of its own, which prints its child's peak RSS (`RUSAGE_CHILDREN`), so
nothing else this session started counts. The difference between the two sweeps' peaks is what the report
keeps per run; what a run's series cost while it is read is paid once, not per run.
Figures go to docs/performance.md ("Watching a sweep").
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench_live import STEPS, fabricate
from trainutil import PY, REPO, env

SIZES = (100, 500)

MEASURE = """
import json, resource, subprocess, sys, time
t = time.perf_counter()
proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
wall = time.perf_counter() - t
print(json.dumps({"rc": proc.returncode, "wall_s": wall, "stderr": proc.stderr[-2000:],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def report(sweep: Path, out: Path) -> dict:
    """`rrtrain report SWEEP --out OUT` in a child of a fresh parent: wall seconds and the child's peak RSS."""
    cmd = [PY, "-c", MEASURE, PY, "-m", "rrtrain", "report", str(sweep), "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=3600, check=True)
    got = json.loads(done.stdout)
    assert got["rc"] == 0, got["stderr"]
    return got


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory) -> dict[int, Path]:
    made = {}
    for n in SIZES:
        root = tmp_path_factory.mktemp(f"bench-report-{n}") / "sweep"
        fabricate(root, n)
        mb = sum(p.stat().st_size for p in root.glob("*/metrics.jsonl")) / 2**20
        print(f"\nfabricated {n} runs x {STEPS} steps: {mb:.0f} MB of metrics.jsonl")
        made[n] = root
    return made


def test_report_wall_and_peak_rss(sweeps, tmp_path):
    got = {n: report(sweeps[n], tmp_path / f"report-{n}") for n in SIZES}
    for n in SIZES:
        print(f"rrtrain report, {n} runs x {STEPS} steps: {got[n]['wall_s']:.1f} s, "
              f"peak RSS {got[n]['peak_rss_mb']:.0f} MB")
    lo, hi = SIZES
    per_run = (got[hi]["peak_rss_mb"] - got[lo]["peak_rss_mb"]) / (hi - lo)
    print(f"peak RSS per extra run: {per_run * 1024:.0f} KB ({hi - lo} runs: "
          f"{got[hi]['peak_rss_mb'] - got[lo]['peak_rss_mb']:.0f} MB)")
    assert (tmp_path / f"report-{hi}" / "report.md").is_file()
