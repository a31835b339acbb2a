"""A sweep's run on the local Slurm cluster, requeued while it trains (`scontrol requeue`, what an admin or
a preemption does): Slurm's SIGTERM makes the trainer checkpoint at a step boundary and exit 75, the entry
point hands the run back to submitit, the job starts again and resumes, and the run ends with exactly its
step count, every step logged once, and the losses of an uninterrupted run of the same config."""

from __future__ import annotations

import json
import signal
import subprocess
import time

from slurmutil import (ACTIVE, cancel, held, restarts, rrtrain, squeue, status, submitted_jobs, sweep_file, wait_done,
                       wait_signalled)
from trainutil import PY, env, final, losses, records, run_cmd

STEPS = 40  # the trainer is held at step 10 or soon after until Slurm's SIGTERM has reached it


def test_scontrol_requeue_resumes_exactly(slurm_cluster, tmp_path, stories_data):
    out = tmp_path / "sweep"
    spec = sweep_file(tmp_path / "sweep.yaml", stories_data, variants=["review"], steps=STEPS,
                      resources={"time_min": 10})
    e = env()
    proc = rrtrain("sweep", str(spec), "--out", str(out), "--executor", "slurm", env=e)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = submitted_jobs(out)[0]["tiny-review-s0"]
    run, ref = out / "tiny-review-s0", tmp_path / "uninterrupted"
    try:
        deadline = time.time() + 240
        while max(losses(run), default=0) < 10 or not (run / "run.lock").exists():
            assert time.time() < deadline and squeue(job).get(job) in ACTIVE | {"PENDING"}, squeue(job)
            time.sleep(0.1)
        pids = [json.loads((run / "run.lock").read_text())["pid"]]  # the trainer: submitit's task itself
        with held(pids):  # the requeue's SIGTERM falls mid-run however fast the machine trains
            held_at = max(losses(run))
            subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, timeout=30)
            wait_signalled(pids, signal.SIGTERM, timeout=60)
        states = wait_done(job, timeout=300)
    finally:
        cancel(job)
    # the same resolved config, uninterrupted (forked by the fork server: the reference, not the path under test)
    reference = run_cmd([PY, "-m", "rrtrain.train", str(out / "configs" / "tiny-review-s0.yaml"), f"run.dir={ref}"],
                        e, timeout=300)
    assert reference.returncode == 0, reference.stderr[-3000:]
    logs = "\n".join(p.read_text() for p in sorted((out / "slurm").rglob("*_log.*")))
    assert states == {job: "COMPLETED"}, logs[-4000:]
    assert restarts(job) >= 1
    resumed = int(logs.split("resumed at step ")[1].split()[0])  # the checkpoint written on Slurm's SIGTERM
    assert held_at <= resumed < STEPS, (held_at, logs[-4000:])
    fin = final(run)
    assert fin["status"] == "completed" and fin["step"] == STEPS
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, STEPS + 1)), "each step once"
    assert losses(run) == losses(ref)
    [row] = status(out, e)["runs"]
    assert row["state"] == "completed" and row["step"] == row["total_steps"] == STEPS
