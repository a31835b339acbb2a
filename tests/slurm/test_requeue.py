"""A sweep's run on the local Slurm cluster, requeued while it trains (`scontrol requeue`, what an admin or
a preemption does): Slurm's SIGTERM makes the trainer checkpoint at a step boundary and exit 75, the entry
point hands the run back to submitit, the job starts again and resumes, and the run ends with exactly its
step count, every step logged once, and the losses of an uninterrupted run of the same config."""

from __future__ import annotations

import subprocess
import time

from slurmutil import ACTIVE, cancel, restarts, rrtrain, squeue, status, submitted_jobs, sweep_file, wait_done
from trainutil import PY, REPO, env, final, losses, records

STEPS = 120


def test_scontrol_requeue_resumes_exactly(slurm_cluster, tmp_path, stories_data):
    out = tmp_path / "sweep"
    spec = sweep_file(tmp_path / "sweep.yaml", stories_data, variants=["review"], steps=STEPS,
                      resources={"time_min": 10})
    e = env()
    proc = rrtrain("sweep", str(spec), "--out", str(out), "--executor", "slurm", env=e)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = submitted_jobs(out)[0]["tiny-review-s0"]
    run, ref = out / "tiny-review-s0", tmp_path / "uninterrupted"
    # the same resolved config, uninterrupted, beside the job (two cores)
    reference = subprocess.Popen([PY, "-m", "rrtrain.train", str(out / "configs" / "tiny-review-s0.yaml"),
                                  f"run.dir={ref}"], cwd=REPO, env=e, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while max(losses(run), default=0) < 10:
            assert time.time() < deadline and squeue(job).get(job) in ACTIVE | {"PENDING"}, squeue(job)
            time.sleep(0.1)
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, timeout=30)
        states = wait_done(job, timeout=300)
        assert reference.wait(timeout=300) == 0, reference.stderr.read()[-3000:]
    finally:
        cancel(job)
        reference.kill()
    logs = "\n".join(p.read_text() for p in sorted((out / "slurm").rglob("*_log.*")))
    assert states == {job: "COMPLETED"}, logs[-4000:]
    assert restarts(job) >= 1
    resumed = int(logs.split("resumed at step ")[1].split()[0])  # the checkpoint written on Slurm's SIGTERM
    assert 10 <= resumed < STEPS, logs[-4000:]
    fin = final(run)
    assert fin["status"] == "completed" and fin["step"] == STEPS
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, STEPS + 1)), "each step once"
    assert losses(run) == losses(ref)
    [row] = status(out, e)["runs"]
    assert row["state"] == "completed" and row["step"] == row["total_steps"] == STEPS
