"""The local executor's warm starts (launchers.executors.warm) against a fresh interpreter per run: a small sweep
through `rrtrain sweep --executor local --parallel 2`, its CPU and wall time.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks/bench_warm_start.py   (or `make bench`)

A vs B in one sitting, interleaved, three sweeps each, medians:
  A "plain subprocesses": RRTRAIN_WARM_START=0, each run a fresh `python -P -m rrtrain.train`;
  B "warm starts": as shipped, the runs forked by one warm interpreter per sweep.
The sweep: the demo's sweep file at the `micro` size, `review` and `standard`, three seeds (6 runs of 8 steps,
one thread each), data prepared once beforehand and shared. CPU s is the sweep's and all its children's user +
sys time (RUSAGE_CHILDREN of this process), which other jobs on a shared machine disturb less than the wall
clock. Both arms train the same runs: their losses are compared bit for bit.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import time
from pathlib import Path

import yaml

from trainutil import PY, REPO, env, losses

SEEDS = 3


def sweep_file(tmp: Path, data: Path) -> Path:
    spec = yaml.safe_load((REPO / "configs" / "sweeps" / "demo.yaml").read_text())
    spec.pop("prep", None)
    spec.update({"config": str(REPO / "configs" / "train" / Path(spec["config"]).name), "data": str(data),
                 "variants": ["review", "standard"],
                 "sizes": {"micro": {"seeds": SEEDS, "overrides": {"train": {"max_steps": 8}}}}})
    path = tmp / "bench.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def one_sweep(spec: Path, out: Path, warm: bool) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([PY, "-m", "rrtrain", "sweep", str(spec), "--out", str(out), "--executor", "local",
                           "--parallel", "2"], cwd=REPO, env={**env(), "RRTRAIN_WARM_START": "1" if warm else "0"},
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ("forked by the warm interpreter" in proc.stdout) == warm
    return {"wall_s": wall, "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}


def test_warm_starts_against_plain_subprocesses(tmp_path, stories_data):
    spec = sweep_file(tmp_path, stories_data)
    arms = {"A: plain subprocesses (RRTRAIN_WARM_START=0)": False, "B: warm starts (as shipped)": True}
    results: dict[str, list[dict]] = {name: [] for name in arms}
    for i in range(3):
        for name, warm in arms.items():
            results[name].append(one_sweep(spec, tmp_path / f"{warm}-{i}", warm))
    runs = sorted(p.name for p in (tmp_path / "True-0").iterdir() if (p / "final.json").exists())
    assert len(runs) == 2 * SEEDS
    for run in runs:
        assert losses(tmp_path / "True-0" / run) == losses(tmp_path / "False-0" / run), run
    print(f"\n| a sweep of {2 * SEEDS} micro runs of 8 steps, --parallel 2 | wall s | CPU s | CPU s per run |")
    print("|---|---|---|---|")
    for name in arms:
        med = {k: statistics.median(r[k] for r in results[name]) for k in results[name][0]}
        print(f"| {name} | {med['wall_s']:.1f} | {med['cpu_s']:.1f} | {med['cpu_s'] / (2 * SEEDS):.2f} |")
    print(json.dumps(results))
