"""A node lost mid-run: a 2-node job of slurm/multinode.sbatch (one rank per node, FSDP) whose second node's
ranks are all killed with SIGKILL ends on the first node too within a bounded time (srun --wait=STEP_GRACE_S,
no rank left waiting in a collective), final.json says failed and why, nothing of the job is left running on
either node, and the run submitted again resumes from the last checkpoint and finishes exactly: every step
once, and the steps recomputed after the checkpoint with the losses they had before the loss. The resubmission
runs on one node (both ranks there): a 2-node checkpoint resumes on 1 node, and the loader's exact-resume rule
(the same micro-batches for the same global ranks) still holds."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from rrtrain.rundir import ranks
from slurmutil import NODES, REPO, START, cancel, node_processes, sbatch, squeue, wait_done
from trainutil import PY, TINY, env, final, losses, records

pytestmark = pytest.mark.distributed

STEPS, CKPT = 30, 6
KILL_AFTER = 13  # steps: past the second checkpoint, 5 steps before the third
BOUND_S = 120  # from the SIGKILL to the end of the job on the surviving node
ARGS = [f"train.max_steps={STEPS}", "train.log_every=1", "train.eval_every=0", f"train.ckpt_every={CKPT}",
        "train.global_batch=8", "train.micro_batch=4", "train.warmup_steps=2", "parallel.backend=fsdp"]


def ranks_of(ns: str) -> list[int]:
    """The training ranks on a node (not the torchrun agent that started them)."""
    agents = set(node_processes(ns, "launchers.torchrun.node"))
    return [p for p in node_processes(ns, "-m rrtrain.train") if p not in agents]


def submit(run: Path, log: Path, data: Path, nodes: int) -> str:
    """The run on `nodes` nodes, 2 ranks in all."""
    per_node = 2 // nodes
    e = {**env(), "RRTRAIN_PYTHON": PY, "RRTRAIN_NPROC_PER_NODE": str(per_node), "RRTRAIN_RUN_DIR": str(run)}
    return sbatch(REPO / "slurm" / "multinode.sbatch", f"--nodes={nodes}", "--ntasks-per-node=1",
                  f"--cpus-per-task={per_node}", "--mem=1G", "--time=10", f"--output={log}", "--no-requeue",
                  args=(TINY, f"data.path={data}", f"run.dir={run}", *ARGS), env=e)


def newest_checkpoint(run: Path) -> int:
    """The step of the newest checkpoint the run published (renamed into place): what a resubmission must resume
    from. A node can die after a step is logged and before that step's checkpoint is published, so the last
    logged step does not say it."""
    steps = [int(p.name.removeprefix("step_")) for p in (run / "checkpoints").glob("step_*") if p.is_dir()]
    assert steps, f"no checkpoint published in {run}"
    return max(steps)


def wait_past_kill_step(run: Path, job: str, log: Path) -> None:
    """Until the running job has logged step KILL_AFTER (its log in the message if it ends first)."""
    deadline = time.time() + 300
    while max(losses(run), default=0) < KILL_AFTER:
        assert time.time() < deadline and squeue(job).get(job) in {"PENDING", "CONFIGURING", "RUNNING"}, \
            log.read_text()[-3000:]
        time.sleep(0.2)


def test_sigkill_of_one_node_fails_the_job_and_it_resumes_on_one_node(slurm_cluster, tmp_path, stories_data):
    run = tmp_path / "run"
    job = submit(run, tmp_path / "first.log", stories_data, nodes=NODES)
    try:
        wait_past_kill_step(run, job, tmp_path / "first.log")
        victims = ranks_of("rrnode2")
        assert victims, "no rank found on rrnode2"
        subprocess.run(["kill", "-9", *map(str, victims)], check=True, timeout=30)
        killed_at = time.time()
        states = wait_done(job, timeout=BOUND_S)
        ended_in = time.time() - killed_at
    finally:
        cancel(job)
    first_log = (tmp_path / "first.log").read_text()
    assert states == {job: "FAILED"}, first_log[-4000:]
    assert ended_in < BOUND_S
    assert ranks_of("rrnode1") == [] and ranks_of("rrnode2") == [], "a rank left running"
    assert (run / "final.json").is_file(), f"no final.json; the job's log:\n{first_log[-4000:]}"
    fin = final(run)
    assert fin["status"] == "failed", fin
    assert fin["reason"], fin
    print(f"first attempt ended {ended_in:.0f} s after the SIGKILL: {fin['reason']}")
    before = losses(run)
    assert max(before) >= KILL_AFTER
    published = newest_checkpoint(run)
    assert CKPT <= published <= max(before), (published, max(before))

    job2 = submit(run, tmp_path / "second.log", stories_data, nodes=1)
    try:
        assert wait_done(job2, timeout=400) == {job2: "COMPLETED"}, (tmp_path / "second.log").read_text()[-4000:]
    finally:
        cancel(job2)
    second_log = (tmp_path / "second.log").read_text()
    resumed = int(second_log.split("resumed at step ")[1].split()[0])
    assert resumed == published, (resumed, published, max(before))
    fin = final(run)
    assert fin["status"] == "completed" and fin["step"] == STEPS and fin["world_size"] == 2
    assert {r["host"] for r in ranks.read(run)} == {"rrnode1"}, "the second attempt ran on one node"
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, STEPS + 1)), "each step once"
    after = losses(run)
    again = [s for s in before if s > resumed]
    assert again and all(after[s] == before[s] for s in again), "the steps after the checkpoint, recomputed"
    assert all(after[s] == before[s] for s in before if s <= resumed)


def test_a_node_that_dies_with_its_slurmd_fails_the_job_and_comes_back(slurm_cluster, tmp_path, stories_data):
    """The second node powered off: its slurmd, step daemon, agent and rank all SIGKILLed at once. The job ends
    (the first node's rank loses its peer; Slurm marks the node down after SlurmdTimeout), final.json says
    failed, start.sh boots the node again, and the run resumes exactly on both nodes."""
    run = tmp_path / "run"
    job = submit(run, tmp_path / "first.log", stories_data, nodes=NODES)
    try:
        wait_past_kill_step(run, job, tmp_path / "first.log")
        everything = subprocess.run(["ip", "netns", "pids", "rrnode2"], capture_output=True, text=True).stdout.split()
        subprocess.run(["kill", "-9", *everything], timeout=30)
        killed_at = time.time()
        states = wait_done(job, timeout=BOUND_S + 60)
        ended_in = time.time() - killed_at
    finally:
        cancel(job)
        # the node boots again before anything is asserted: the tests after this one need the whole cluster
        boot = subprocess.run(["bash", str(START), "--nodes", str(NODES)], capture_output=True, text=True,
                              timeout=300)
    assert boot.returncode == 0, boot.stderr
    first_log = (tmp_path / "first.log").read_text()
    assert states[job] in {"FAILED", "NODE_FAIL"}, (states, first_log[-4000:])
    assert ended_in < BOUND_S + 60
    assert ranks_of("rrnode1") == [], "a rank left running on the surviving node"
    assert (run / "final.json").is_file(), f"no final.json; the job's log:\n{first_log[-4000:]}"
    fin = final(run)
    assert fin["status"] == "failed" and fin["reason"], fin
    print(f"node lost: job {states[job]} {ended_in:.0f} s after; final.json: {fin['reason']}")
    before = losses(run)
    published = newest_checkpoint(run)
    assert CKPT <= published <= max(before), (published, max(before))

    job2 = submit(run, tmp_path / "second.log", stories_data, nodes=NODES)
    try:
        assert wait_done(job2, timeout=400) == {job2: "COMPLETED"}, (tmp_path / "second.log").read_text()[-4000:]
    finally:
        cancel(job2)
    resumed = int((tmp_path / "second.log").read_text().split("resumed at step ")[1].split()[0])
    assert resumed == published, (resumed, published, max(before))
    assert final(run)["status"] == "completed"
    assert [r["step"] for r in records(run) if "loss" in r] == list(range(1, STEPS + 1)), "each step once"
    assert all(losses(run)[s] == before[s] for s in before)
    assert {r["host"] for r in ranks.read(run)} == {"rrnode1", "rrnode2"}


def test_a_rank_hung_on_the_second_node_is_named_with_its_host(slurm_cluster, tmp_path, stories_data):
    """SIGSTOP of the second node's rank (a hang: its sockets stay open, so no collective fails): the first
    node's heartbeat watch names it, with its host, within parallel.timeout_s, and the job ends."""
    run = tmp_path / "run"
    e = {**env(), "RRTRAIN_PYTHON": PY, "RRTRAIN_NPROC_PER_NODE": "1", "RRTRAIN_RUN_DIR": str(run),
         "STEP_GRACE_S": "10"}
    job = sbatch(REPO / "slurm" / "multinode.sbatch", f"--nodes={NODES}", "--ntasks-per-node=1",
                 "--cpus-per-task=1", "--mem=1G", "--time=10", f"--output={tmp_path / 'job.log'}", "--no-requeue",
                 args=(TINY, f"data.path={stories_data}", f"run.dir={run}", *ARGS, "train.max_steps=400",
                       "parallel.timeout_s=30"), env=e)
    try:
        deadline = time.time() + 300
        while max(losses(run), default=0) < 5:
            assert time.time() < deadline and squeue(job).get(job) in {"PENDING", "CONFIGURING", "RUNNING"}, \
                (tmp_path / "job.log").read_text()[-3000:]
            time.sleep(0.2)
        victims = ranks_of("rrnode2")
        subprocess.run(["kill", "-STOP", *map(str, victims)], check=True, timeout=30)
        states = wait_done(job, timeout=BOUND_S)
    finally:
        cancel(job)
    log = (tmp_path / "job.log").read_text()
    assert states == {job: "FAILED"}, log[-4000:]
    fin = final(run)
    assert fin["status"] == "failed", fin
    assert "rank 1 of 2 stopped responding" in fin["reason"] and "rank 1 ran on rrnode2" in fin["reason"], fin
    assert ranks_of("rrnode2") == [], "the hung rank was ended with its job"
