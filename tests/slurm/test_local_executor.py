"""The time-limit path through submitit's LocalExecutor, which simulates a time limit on this machine: it
sends USR2 `signal_delay_s` before `timeout_min` and restarts the job when the job asks to be requeued.
The run checkpoints on the USR2, the entry point requeues through submitit's protocol, and the restarted
job resumes, until the run finishes with exactly its step count and every step logged once. No Slurm.

The LocalExecutor restarts a job at most 6 times; on a busy machine that may not be enough, and then the
run is submitted again, as `rrtrain sweep` resubmits a preempted run.

One task: a rank other than 0 waits for rank 0's requeue to end the job (on Slurm it does at once), and the
LocalExecutor restarts a job only when all its tasks have exited, so with two tasks every attempt would last
the whole time limit. The two-rank path is tested on the cluster (test_timelimit.py)."""

from __future__ import annotations

import submitit

from launchers.entry import RunJob
from slurmutil import rrtrain, sweep_file
from trainutil import env, final, records

STEPS = 1200  # longer than one attempt (SIGNAL_AFTER_S) even on a quiet machine (400 steps took 13 s)
SIGNAL_AFTER_S = 25  # USR2 this long after each attempt starts (start-up takes 5-20 s of it)
SUBMISSIONS = 3


def test_local_executor_time_limit_requeues_until_done(tmp_path, stories_data):
    out = tmp_path / "sweep"
    spec = sweep_file(tmp_path / "sweep.yaml", stories_data, variants=["review"], steps=STEPS, resources={})
    proc = rrtrain("sweep", str(spec), "--out", str(out), "--dry-run", env=env())  # writes the run's config
    assert proc.returncode == 0, proc.stdout + proc.stderr
    executor = submitit.LocalExecutor(folder=str(tmp_path / "submitit"), max_num_timeout=6)
    executor.update_parameters(timeout_min=(SIGNAL_AFTER_S + 10) / 60, signal_delay_s=10, tasks_per_node=1)
    run, logs, result = out / "tiny-review-s0", [], None
    for _ in range(SUBMISSIONS):
        job = executor.submit(RunJob(str(out)), "tiny-review-s0")
        try:
            result = job.result()
        except submitit.core.utils.UncompletedJobError:
            assert final(run)["status"] == "preempted", job.stderr()  # out of restarts, not failed
        finally:
            logs.append(job.stdout() or "")
        if result is not None:
            break
    log = "\n".join(logs)
    assert result is not None, f"not done after {SUBMISSIONS} submissions:\n{log[-3000:]}"
    assert result["status"] == "completed" and result["step"] == STEPS
    assert log.count("Requeued job") >= 1 and "resumed at step" in log, log[-3000:]
    assert final(run)["status"] == "completed"
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, STEPS + 1)), "each step once"
