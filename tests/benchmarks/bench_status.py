"""CPU time of `rrtrain status` on a big sweep: 200 runs whose metrics.jsonl are 200 MB each (sparse padding,
then 300 real steps), half of them running (locked by this process), half completed.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks -k status   (or `make bench`)

The figure is this process's CPU time (`time.process_time`), what reading whole logs would cost whatever else
runs on the machine; docs/cluster.md quotes the target (under 2 s). The suite checks the mechanism instead (the
bytes read per file, tests/unit/launchers/state/test_sweep_status.py), which does not depend on the machine's load.
"""

from __future__ import annotations

import time

from launchers.sweep import record
from launchers.state import status as status_cli
from rrtrain.rundir import lock as runlock

from sweeputil import write_record
from unit.launchers.state.test_sweep_status import fake_run  # the suite's big run, measured here instead of checked

RUNS, BIG_MB, TARGET_CPU_S = 200, 200, 2.0


def test_status_cpu_on_200_big_runs(tmp_path):
    runs, held = {}, []
    for i in range(RUNS):
        rid = f"tiny-review-s{i}"
        final = {"status": "completed", "step": 1000, "tokens": 512000, "flags": []} if i % 2 else None
        runs[rid] = fake_run(tmp_path, rid, 1000 if i % 2 else 500 + i, BIG_MB, final)
        if final is None:
            held.append(runlock.RunLock(tmp_path / rid).acquire(0))
    write_record(tmp_path, {"version": 1, "name": "big", "runs": runs, "submissions": []})
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        status = status_cli.collect(tmp_path)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        for lock in held:
            lock.release()
    assert status["counts"] == {"running": RUNS // 2, "completed": RUNS // 2}
    print(f"\nrrtrain status, {RUNS} runs of {BIG_MB} MB metrics: {cpu:.2f} s CPU, {wall:.2f} s wall "
          f"(target: under {TARGET_CPU_S:g} s CPU)")
