"""What `rrtrain status`, `status --watch`, `rrtrain report` and the live dashboard cost on a big sweep.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks/bench_live.py

A fabricated sweep of 500 runs x 3,000 steps (a training line per step, an evaluation line and a diagnostic
line every 100 steps; ~150 MB), 499 ended and one still going:
  - `rrtrain status --json` as a command (wall, peak RSS), and `status_cli.collect` in process: a full read
    vs a refresh through the `--watch` cache (`launchers.state.cache`) after the running run appended 10 steps
    (target < 0.5 s);
  - `rrtrain report` (wall, peak RSS);
  - the dashboard on the first 200 runs: building the logdir, then a refresh with one run advancing, then one
    with nothing changed; and what its `_sweep` tab (the status table) adds to a refresh on the 500 runs.
Figures go to docs/performance.md ("Watching a sweep").
"""

from __future__ import annotations

import json
import resource
import subprocess
import time
from pathlib import Path

import pytest

from sweeputil import write_record
from trainutil import PY, REPO, env

RUNS, STEPS = 500, 3000


def fabricate(root: Path, n: int = RUNS, steps: int = STEPS) -> dict:
    """The sweep directory and its sweep.json; run 0 is still going (no final.json)."""
    from launchers.sweep import record

    entries = {}
    for i in range(n):
        variant, seed = ("review", "standard")[i % 2], i // 2
        rid = f"tiny-{variant}-s{seed}"
        run = root / rid
        run.mkdir(parents=True)
        out = []
        for s in range(1, steps + 1):
            out.append(f'{{"step": {s}, "loss": {5 - s / 1000:.6f}, "grad_norm": 1.0, "lr": 0.001, '
                       f'"tokens": {s * 4096}, "tokens_per_s": 12345.0}}\n')
            if s % 100 == 0:
                out.append(f'{{"step": {s}, "val_loss": {5 - s / 1000:.6f}, "tokens": {s * 4096}}}\n')
                out.append(f'{{"kind": "diag", "step": {s}, "gate_mean": [0.5, 0.5, 0.5, 0.5], '
                           f'"gate_hist": [[0, 1, 2, 3, 2, 1, 0, 0], [0, 1, 2, 3, 2, 1, 0, 0]], '
                           f'"block_grad_norm": [{", ".join(["0.1"] * 8)}]}}\n')
        (run / "metrics.jsonl").write_text("".join(out))
        config = {"model": {"size": "tiny", "variant": variant}, "train": {"seed": seed, "max_steps": steps + 1000,
                                                                          "tokens": None, "global_batch": 8},
                  "data": {"path": None}, "run": {"dir": str(run)}}
        import yaml

        (run / "config.yaml").write_text(yaml.safe_dump(config))
        if i:
            (run / "final.json").write_text(json.dumps(
                {"status": "completed", "step": steps, "tokens": steps * 4096, "final_val_loss": 2.0,
                 "best_val_loss": 2.0, "variant": variant, "size": "tiny", "seed": seed, "params": 1e6}))
        entries[rid] = {"size": "tiny", "variant": variant, "seed": seed, "dir": str(run), "config": config,
                        "resources": {}}
    write_record(root, {"version": 1, "name": "bench", "runs": entries, "submissions": []})
    return entries


def advance(run: Path, start: int, n: int = 10) -> None:
    with open(run / "metrics.jsonl", "a") as f:
        for s in range(start, start + n):
            f.write(f'{{"step": {s}, "loss": 2.0, "grad_norm": 1.0, "lr": 0.001, "tokens": {s * 4096}}}\n')


def command(*args: str) -> tuple[float, float]:
    """(wall s, peak RSS MB) of `rrtrain ARGS` in a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    proc = subprocess.run([PY, "-m", "rrtrain", *args], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=3600)
    wall = time.perf_counter() - t
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024  # ru_maxrss of the largest child so far (KB on Linux)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bench-live") / "sweep"
    t = time.perf_counter()
    fabricate(root)
    size = sum(p.stat().st_size for p in root.glob("*/metrics.jsonl")) / 2**20
    print(f"\nfabricated {RUNS} runs x {STEPS} steps: {size:.0f} MB of metrics.jsonl in {time.perf_counter() - t:.0f} s")
    return root


def test_status_full_vs_watch_refresh(sweep):
    from launchers.state import status as status_cli
    from launchers.state.cache import StatusCache

    wall, rss = command("status", str(sweep), "--json")
    print(f"rrtrain status --json (a command): {wall:.2f} s, peak RSS {rss:.0f} MB")
    t = time.perf_counter()
    status_cli.collect(sweep)
    full = time.perf_counter() - t
    cache = StatusCache()
    t = time.perf_counter()
    status_cli.collect(sweep, cache)
    first = time.perf_counter() - t
    running = sweep / "tiny-review-s0"
    times = []
    for k in range(5):
        advance(running, STEPS + 1 + 10 * k)
        t = time.perf_counter()
        rows = {r["id"]: r for r in status_cli.collect(sweep, cache)["runs"]}
        times.append(time.perf_counter() - t)
        assert rows["tiny-review-s0"]["step"] == STEPS + 10 * (k + 1)
    refresh = sorted(times)[len(times) // 2]
    print(f"status_cli.collect, full read: {full:.2f} s; --watch first refresh {first:.2f} s; "
          f"a refresh with one run advancing (median of 5): {refresh:.3f} s")
    assert refresh < 0.5


def test_report_memory(sweep, tmp_path):
    wall, rss = command("report", str(sweep), "--out", str(tmp_path / "report"))
    print(f"rrtrain report: {wall:.1f} s, peak RSS {rss:.0f} MB (the largest child so far)")


def test_dashboard_sweep_tab_refresh(sweep):
    """The `_sweep` tab's table (`rrtrain status`'s, `rrtrain.cli.dashboard.StatusSummary`) on the 500 runs: what
    it adds to each dashboard refresh, with one run advancing."""
    from rrtrain.cli.dashboard import StatusSummary

    summary = StatusSummary(sweep)
    t = time.perf_counter()
    assert summary() is not None
    first = time.perf_counter() - t
    running = sweep / "tiny-review-s0"
    start = STEPS + 10_001  # above any step another test appended
    times = []
    for k in range(5):
        advance(running, start + 10 * k)
        t = time.perf_counter()
        table = summary()
        times.append(time.perf_counter() - t)
        assert f"{start + 10 * k + 9}/" in table
    print(f"dashboard sweep tab (the status table) on {RUNS} runs: first {first:.2f} s; a refresh with one run "
          f"advancing (median of 5): {sorted(times)[len(times) // 2]:.3f} s")


def test_dashboard_refresh_on_200_runs(sweep, tmp_path):
    import shutil

    from rrtrain.dashboard.tensorboard import build_logdir

    small = tmp_path / "sweep200"
    small.mkdir()
    for run in sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.startswith("tiny-"))[:200]:
        shutil.copytree(run, small / run.name)
    state = []
    t = time.perf_counter()
    build_logdir(small, state)
    build = time.perf_counter() - t
    kept = state[0]
    times, idle = [], []
    running = small / "tiny-review-s0"
    for k in range(5):
        advance(running, STEPS + 1 + 10 * k)
        t = time.perf_counter()
        assert kept.refresh() == 1
        times.append(time.perf_counter() - t)
        t = time.perf_counter()
        assert kept.refresh() == 0
        idle.append(time.perf_counter() - t)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"dashboard on 200 runs: first build {build:.1f} s; a refresh with one run advancing {med(times):.3f} s; "
          f"with nothing changed {med(idle):.3f} s (medians of 5)")
