"""The time-limit path through submitit's LocalExecutor, which simulates a time limit on this machine: it
sends USR2 `signal_delay_s` before `timeout_min` and restarts the job when the job asks to be requeued.
The run checkpoints on the USR2, the entry point requeues through submitit's protocol, and the restarted
job resumes, until the run finishes with exactly its step count and every step logged once. No Slurm.

The executor keeps each attempt's clock in its controller process, and the test stops that clock (SIGSTOP)
whenever it is not the thing under test, so that no step depends on the machine's speed: while the first
attempt starts up (the clock resumes once the trainer has logged its first step and is held there: the
warning then falls mid-run however fast the machine trains), and for the whole of the second attempt (which
then runs to the end however slowly it resumes: a loaded machine once took more than the executor's timer to
resume, was warned again mid-load and ran out of restarts). The trainer checks for a stop every step, so it
acts on the warning at the step after the hold; the time it has for that, its checkpoint and its exit is
generous (a loaded machine took over 20 s), and is waited only when taken.

One task: a rank other than 0 waits for rank 0's requeue to end the job (on Slurm it does at once), and the
LocalExecutor restarts a job only when all its tasks have exited, so with two tasks every attempt would last
the whole time limit. The multi-rank path is tested on the cluster, with four ranks on two nodes
(test_multinode_2node.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import submitit

from launchers.executors.entry import RunJob
from slurmutil import children, ended, held, let_go, rrtrain, stop, sweep_file, wait_signalled
from trainutil import env, final, losses, records

STEPS = 20  # the trainer is held at its first logged step until the warning: what follows the resume is short
SIGNAL_AFTER_S = 20  # USR2 this long after each attempt starts, on the executor's clock (stopped during start-up)
EXIT_WITHIN_S = 120  # then the time the task has to save and exit before the executor kills it (not a requeue)
#: how long the test waits for the warning: the executor's clock counts sleeps of 1/24 s, which a loaded machine
#: stretches (its 20 s took more than 50 in a full `make test`); a bound, not a wait, while the trainer is held
SIGNAL_WAIT_S = 300


def _task(controller: int, deadline: float, other_than: int | None = None) -> int:
    """The executor's task (the trainer), once the controller has started one that is not `other_than`."""
    while not (tasks := [pid for pid in children(controller) if pid != other_than]):
        assert time.time() < deadline, "the executor started no task in time"
        time.sleep(0.02)
    return tasks[0]


def test_local_executor_time_limit_requeues_until_done(tmp_path, stories_data, monkeypatch):
    # the executor's controller and tasks inherit this process's environment: one thread, as every run the tests
    # start has (trainutil.env) and as a Slurm task of one CPU has (OMP_NUM_THREADS=cpus_per_task)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
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
    # submitit's controller (`python -m submitit.local._local FOLDER`, a child of this process): it starts each
    # attempt and keeps its clock
    controller, = (pid for pid in children(os.getpid())
                   if str(tmp_path / "submitit") in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"))
    deadline = time.time() + 300 + SIGNAL_WAIT_S
    try:
        first = _task(controller, deadline)
        stop([controller])
        while not losses(run):
            assert time.time() < deadline and not ended(first), job.stderr()
            time.sleep(0.05)
        assert json.loads((run / "run.lock").read_text())["pid"] == first  # the trainer is the task itself
        with held([first]):
            held_at = max(losses(run))
            let_go([controller])
            wait_signalled([first], signal.SIGUSR2, timeout=SIGNAL_WAIT_S)
        second = _task(controller, deadline, other_than=first)  # requeued
        stop([controller])
        while not ended(second):
            assert time.time() < deadline, job.stderr()
            time.sleep(0.05)
        let_go([controller])
        try:
            result = job.result()
        except submitit.core.utils.UncompletedJobError as err:  # killed by the executor, or out of restarts
            raise AssertionError(f"{err}\n{(job.stdout() or '')[-3000:]}\n{(job.stderr() or '')[-3000:]}") from None
    finally:
        let_go([controller])
        if not job.done():
            job.cancel(check=False)
    log = job.stdout() or ""
    assert result["status"] == "completed" and result["step"] == STEPS, result
    resumed = [int(s) for s in re.findall(r"resumed at step (\d+)", log)]
    assert log.count("Requeued job") == 1 and len(resumed) == 1 and held_at <= resumed[0] < STEPS, log[-3000:]
    assert final(run)["status"] == "completed"
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, STEPS + 1)), "each step once"
