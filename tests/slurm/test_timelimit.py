"""The time-limit path with two ranks: a submitit job on the local cluster whose time limit runs out before
its run ends gets USR2 before the limit; both ranks agree at a step boundary, save collectively (FSDP, gloo)
and exit 75; the entry point requeues through submitit; the run resumes on the next allocation and finishes
with exactly its step count and every step logged once.

Slurm checks time limits every 30 s and its least limit is one minute, while this machine needs 15-30 s to
start two ranks: a job submitted with a one-minute limit would get its warning before it trains. So the job
starts with a long limit, and once it trains the test shortens the limit to 1-2 minutes from now (Slurm
then sends the USR2 at its next check, within about 30 s); once requeued, the long limit is given back for
the second run. While Slurm's warning is on its way both ranks are held (SIGSTOP; Slurm continues a task it
signals), so the warning falls mid-run however fast the machine trains, and a short run serves."""

from __future__ import annotations

import json
import signal
import time

from rrtrain.rundir import ranks
from slurmutil import (ACTIVE, cancel, elapsed_s, held, job_logs, restarts, rrtrain, set_time_limit, squeue,
                       status, submitted_jobs, sweep_file, wait_signalled)
from trainutil import env, final, losses, records

STEPS = 80  # the test holds the ranks at step 5 or soon after (about 10 steps later on a fast machine)
DELAY_S = 120  # the warning comes when less than this is left: at the first check after the limit is cut


def test_usr2_before_the_time_limit_checkpoints_and_requeues_two_ranks(slurm_cluster, tmp_path, stories_data):
    out = tmp_path / "sweep"
    spec = sweep_file(tmp_path / "sweep.yaml", stories_data, variants=["review"], steps=STEPS,
                      resources={"tasks_per_node": 2, "time_min": 10, "signal_delay_s": DELAY_S, "max_requeues": 3},
                      overrides={"parallel.backend": "fsdp", "train.micro_batch": 4, "train.stop_check_every": 2})
    e = env()
    proc = rrtrain("sweep", str(spec), "--out", str(out), "--executor", "slurm", env=e)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = submitted_jobs(out)[0]["tiny-review-s0"]
    run = out / "tiny-review-s0"
    try:
        deadline = time.time() + 600  # a loaded machine (2 workers of make test and more) starts slowly
        while max(losses(run), default=0) < 5 or len(ranks.read(run)) < 2:
            assert time.time() < deadline and squeue(job).get(job) in ACTIVE, job_logs(out)
            time.sleep(0.1)
        pids = [r["pid"] for r in ranks.read(run)]
        with held(pids):
            held_at = max(losses(run))
            set_time_limit(job, elapsed_s(job) // 60 + 2)  # 60-120 s left: less than DELAY_S
            wait_signalled(pids, signal.SIGUSR2, timeout=90)  # Slurm's next time-limit check, within 30 s
        while restarts(job) < 1:
            assert time.time() < deadline and squeue(job).get(job) in ACTIVE, job_logs(out)
            time.sleep(0.2)
        stop = json.loads((run / "final.json").read_text())  # as the first allocation left it
        set_time_limit(job, 30)  # long enough that a slow second run gets no second warning
        while squeue(job).get(job) in ACTIVE:
            assert time.time() < deadline, job_logs(out)
            time.sleep(0.5)
    finally:
        cancel(job)
    logs = "\n".join(p.read_text() for p in sorted((out / "slurm").rglob("*_log.*")))
    assert squeue(job) == {job: "COMPLETED"}, logs[-4000:]
    assert restarts(job) == 1
    assert stop["status"] == "preempted" and stop["signal"] == "SIGUSR2" and held_at <= stop["step"] < STEPS, stop
    assert f"resumed at step {stop['step']}" in logs
    fin = final(run)
    assert fin["status"] == "completed" and fin["step"] == STEPS and fin["world_size"] == 2
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, STEPS + 1))
    [row] = status(out, e)["runs"]
    assert row["state"] == "completed" and row["step"] == STEPS
