"""`rrtrain sweep --cancel-flagged` on the local cluster: of two running jobs of a sweep, only the one the
monitor flagged is cancelled (scancel), it is not requeued, status reports it stalled and cancelled, and
sweep.json records why; the healthy run keeps running."""

from __future__ import annotations

import json
import time
from pathlib import Path

from slurmutil import (STALL_AT_ONCE, cancel, job_logs, rrtrain, squeue, status, submitted_jobs, sweep_file, wait_done,
                       wait_state)
from trainutil import env, records

FLAGGED, HEALTHY = "tiny-standard-s0", "tiny-review-s0"


def wait_for_flag(run_dir: Path, flag: str, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if (run_dir / "metrics.jsonl").exists() and any(r.get("flag") == flag for r in records(run_dir)):
            return
        time.sleep(1.0)
    raise AssertionError(f"{run_dir.name} raised no {flag} flag in {timeout} s")


def test_cancel_flagged_cancels_exactly_the_flagged_run(slurm_cluster, tmp_path, stories_data):
    out = tmp_path / "sweep"
    spec = sweep_file(tmp_path / "sweep.yaml", stories_data, variants=["review", "standard"], steps=100000,
                      resources={"time_min": 10, "array_parallelism": 2}, runs={FLAGGED: STALL_AT_ONCE},
                      overrides={"train.log_every": 5})
    e = env()
    proc = rrtrain("sweep", str(spec), "--out", str(out), "--executor", "slurm", env=e)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [jobs] = submitted_jobs(out)
    try:
        for job in jobs.values():
            wait_state(job, {"RUNNING"}, timeout=240)
        wait_for_flag(out / FLAGGED, "stalled")
        early = squeue(jobs[HEALTHY])
        assert early == {jobs[HEALTHY]: "RUNNING"}, f"the healthy run ended before any cancel: {early}\n{job_logs(out)}"
        assert status(out, e)["runs"][0]["id"] == FLAGGED  # flagged: needs attention first

        done = rrtrain("sweep", "--cancel-flagged", str(out), env=e)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"cancelled {FLAGGED}" in done.stdout and HEALTHY not in done.stdout, done.stdout
        assert wait_done(jobs[FLAGGED], timeout=120) == {jobs[FLAGGED]: "CANCELLED"}
        healthy = squeue(jobs[HEALTHY])
        assert healthy == {jobs[HEALTHY]: "RUNNING"}, f"the healthy run keeps running: {healthy}\n{job_logs(out)}"

        deadline = time.time() + 60
        while True:  # the cancelled run's trainer checkpoints at a step boundary and lets go of its lock
            rows = {r["id"]: r for r in status(out, e)["runs"]}
            if rows[FLAGGED]["state"] != "running" or time.time() > deadline:
                break
            time.sleep(1.0)
        assert rows[FLAGGED]["state"] == "stalled" and "cancelled" in rows[FLAGGED]["flags"], rows[FLAGGED]
        assert rows[HEALTHY]["state"] == "running" and "cancelled" not in rows[HEALTHY]["flags"]
        cancellations = json.loads((out / "sweep.json").read_text())["cancellations"]
        assert [list(c["runs"]) for c in cancellations] == [[FLAGGED]]
        assert "stalled" in cancellations[0]["runs"][FLAGGED]
    finally:
        cancel(*jobs.values())
