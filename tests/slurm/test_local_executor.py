"""The time-limit path through submitit's LocalExecutor, which simulates a time limit on this machine: it
sends USR2 `signal_delay_s` before `timeout_min` and restarts the job when the job asks to be requeued.
The run checkpoints on the USR2, the entry point requeues through submitit's protocol, and the restarted
job resumes, until the run finishes with exactly its step count and every step logged once. No Slurm.

The trainer is held (SIGSTOP) from its first logged step until the executor's USR2 is pending, so that the
warning falls mid-run however fast the machine trains: the run need not outlast the executor's timer, and a
short run serves (a run long enough to outlast it on a quiet machine took over a dozen attempts on a loaded
one). It checks for a stop every step, so it acts on the warning at the step after the hold; the time it has
for that, its checkpoint and its exit is generous (a loaded machine took over 20 s), and is waited only when
taken.

One task: a rank other than 0 waits for rank 0's requeue to end the job (on Slurm it does at once), and the
LocalExecutor restarts a job only when all its tasks have exited, so with two tasks every attempt would last
the whole time limit. The two-rank path is tested on the cluster (test_timelimit.py)."""

from __future__ import annotations

import json
import re
import signal
import time

import submitit

from launchers.executors.entry import RunJob
from slurmutil import held, rrtrain, sweep_file, wait_signalled
from trainutil import env, final, losses, records

STEPS = 20  # the trainer is held at its first logged step until the warning: what follows the resume is short
SIGNAL_AFTER_S = 40  # USR2 this long after each attempt starts (start-up to the first step takes 5-20 s of it)
EXIT_WITHIN_S = 120  # then the time the task has to save and exit before the executor kills it (not a requeue)


def test_local_executor_time_limit_requeues_until_done(tmp_path, stories_data):
    out = tmp_path / "sweep"
    spec = sweep_file(tmp_path / "sweep.yaml", stories_data, variants=["review"], steps=STEPS, resources={},
                      overrides={"train.stop_check_every": 1})
    proc = rrtrain("sweep", str(spec), "--out", str(out), "--dry-run", env=env())  # writes the run's config
    assert proc.returncode == 0, proc.stdout + proc.stderr
    executor = submitit.LocalExecutor(folder=str(tmp_path / "submitit"), max_num_timeout=6)
    executor.update_parameters(timeout_min=(SIGNAL_AFTER_S + EXIT_WITHIN_S) / 60, signal_delay_s=EXIT_WITHIN_S,
                               tasks_per_node=1)
    run = out / "tiny-review-s0"
    job = executor.submit(RunJob(str(out)), "tiny-review-s0")
    try:
        deadline = time.time() + 300
        while not losses(run):
            assert time.time() < deadline and not job.done(), job.stderr()
            time.sleep(0.05)
        pid = json.loads((run / "run.lock").read_text())["pid"]  # the trainer: the task itself
        with held([pid]):
            held_at = max(losses(run))
            wait_signalled([pid], signal.SIGUSR2, timeout=SIGNAL_AFTER_S + 10)
        try:
            result = job.result()
        except submitit.core.utils.UncompletedJobError as err:  # killed by the executor, or out of restarts
            raise AssertionError(f"{err}\n{(job.stdout() or '')[-3000:]}\n{(job.stderr() or '')[-3000:]}") from None
    finally:
        if not job.done():
            job.cancel(check=False)
    log = job.stdout() or ""
    assert result["status"] == "completed" and result["step"] == STEPS, result
    resumed = [int(s) for s in re.findall(r"resumed at step (\d+)", log)]
    assert log.count("Requeued job") >= 1 and resumed and held_at <= resumed[0] < STEPS, log[-3000:]
    assert final(run)["status"] == "completed"
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, STEPS + 1)), "each step once"
