"""A training job on the local Slurm cluster, requeued while it runs (`scontrol requeue`): Slurm's SIGTERM
makes the trainer checkpoint at a step boundary and exit 75, the job starts again and resumes, and the run
ends with exactly its step count, every step logged once, and the losses of an uninterrupted run."""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path

from slurmutil import cancel, restarts, sbatch, squeue, wait_done
from trainutil import final, losses, records, train_cmd, env

STEPS = 120
ARGS = [f"train.max_steps={STEPS}", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=0",
        "train.global_batch=8", "train.micro_batch=8", "train.warmup_steps=2"]


def batch_script(path: Path, run_dir: Path, data: Path, log: Path) -> Path:
    """A plain batch script: one run, requeueable, its log appended across restarts."""
    cmd = " ".join(shlex.quote(a) for a in train_cmd(run_dir, data, ARGS))
    path.write_text("#!/bin/bash\n"
                    "#SBATCH --job-name=rr-requeue --requeue --cpus-per-task=1 --time=5\n"
                    f"#SBATCH --output={log} --open-mode=append\n"
                    'echo "start restart=${SLURM_RESTART_COUNT:-0}"\n'
                    f"exec {cmd}\n")
    return path


def wait_for_training(run_dir: Path, job: str, step: int, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if max(losses(run_dir), default=0) >= step:
            return
        states = set(squeue(job).values())
        assert states <= {"PENDING", "CONFIGURING", "RUNNING"}, f"job {job} left before step {step}: {states}"
        time.sleep(0.1)
    raise AssertionError(f"job {job} did not reach step {step} in {timeout} s")


def test_scontrol_requeue_resumes_exactly(slurm_cluster, tmp_path, stories_data):
    ref_dir, run_dir, log = tmp_path / "uninterrupted", tmp_path / "requeued", tmp_path / "job.log"
    reference = subprocess.Popen(train_cmd(ref_dir, stories_data, ARGS), env=env(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)  # runs beside the job: two cores
    job = sbatch(batch_script(tmp_path / "run.sbatch", run_dir, stories_data, log), env=env())
    try:
        wait_for_training(run_dir, job, 10)
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, timeout=30)
        states = wait_done(job, timeout=300)
        assert states == {job: "COMPLETED"}, (states, log.read_text()[-3000:])
        assert restarts(job) == 1
        assert reference.wait(timeout=300) == 0, reference.stderr.read()[-3000:]
    finally:
        cancel(job)
        reference.kill()
    text = log.read_text()
    assert "start restart=0" in text and "start restart=1" in text, text[-3000:]
    resumed = int(text.split("resumed at step ")[1].split()[0])  # the checkpoint written on Slurm's SIGTERM
    assert 10 <= resumed < STEPS, text[-3000:]
    fin = final(run_dir)
    assert fin["status"] == "completed" and fin["step"] == STEPS
    steps = [r["step"] for r in records(run_dir) if "loss" in r]
    assert steps == list(range(1, STEPS + 1)), "every step logged exactly once, in order"
    assert losses(run_dir) == losses(ref_dir)
