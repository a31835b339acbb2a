"""A rendezvous per job: two 2-node jobs of slurm/multinode.sbatch on the same two nodes (so with the same head
node) run at the same time and both finish, each at the port and id drawn for it at submission
(`python -m launchers.torchrun.rendezvous new`, RRTRAIN_RDZV_FILE), which no process's command line shows.
With the old fixed port (29500) the second job's rendezvous would meet the first job's store; with a port
derived from the job id, a co-tenant could squat it (test_rendezvous_errors.py). One rank per node, a few steps:
the point is the rendezvous. Both jobs also take both nodes' streaming locks at the same moment: when each
node's lock was taken blocking and held across the job's barriers, the two jobs could each hold one and wait for
the other for good (now tests/distributed/test_shm_guard_machines.py)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from launchers.torchrun import rendezvous
from slurmutil import NODES, REPO, cancel, node_processes, sbatch, squeue, wait_done
from trainutil import PY, TINY, env, final

pytestmark = pytest.mark.distributed

ARGS = ["train.max_steps=4", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=0",
        "train.global_batch=8", "train.micro_batch=4", "train.warmup_steps=2", "parallel.backend=fsdp"]


class CommandLines:
    """Every command line of the nodes' processes that mention the job's launcher, sampled while the jobs run."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self) -> None:
        for ns in (f"rrnode{i}" for i in range(1, NODES + 1)):
            for pid in node_processes(ns, "rrtrain"):
                with contextlib.suppress(OSError):
                    self.seen.add(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())


def test_two_jobs_sharing_a_head_node_each_meet_at_their_own_drawn_rendezvous(slurm_cluster, tmp_path, stories_data):
    drawn: list[rendezvous.Rendezvous] = []
    while len({d.port for d in drawn}) < 2:  # two draws share a port once in ~13,000 pairs: not this test's point
        drawn = [rendezvous.draw(), rendezvous.draw()]
    e = env()
    e.update(RRTRAIN_PYTHON=PY, RRTRAIN_NPROC_PER_NODE="1")
    jobs, lines = {}, CommandLines()
    for name, rdzv in zip(("a", "b"), drawn):
        run, path = tmp_path / name, tmp_path / f"{name}.rendezvous"
        rendezvous.write(path, rdzv)
        jobs[name] = sbatch(REPO / "slurm" / "multinode.sbatch", f"--nodes={NODES}", "--ntasks-per-node=1",
                            "--cpus-per-task=1", "--mem=1G", "--time=10", f"--output={tmp_path / name}.log",
                            args=(TINY, f"data.path={stories_data}", f"run.dir={run}", *ARGS),
                            env={**e, "RRTRAIN_RUN_DIR": str(run), "RRTRAIN_RDZV_FILE": str(path)})
    try:
        together, deadline = False, time.time() + 300
        while time.time() < deadline and not together:
            states = [squeue(j).get(j) for j in jobs.values()]
            together = states == ["RUNNING", "RUNNING"]
            if any(s not in ("PENDING", "CONFIGURING", "RUNNING") for s in states):
                break
            time.sleep(0.5)
        try:
            done = {name: wait_done(job, timeout=300, each=lines)[job] for name, job in jobs.items()}
        except AssertionError as err:
            raise AssertionError(f"{err}\n{read_logs(tmp_path, jobs)}") from None
    finally:
        cancel(*jobs.values())
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in jobs}
    assert together, "the two jobs never ran at the same time"
    assert done == {"a": "COMPLETED", "b": "COMPLETED"}, "\n".join(t[-3000:] for t in logs.values())
    for name, rdzv in zip(jobs, drawn):
        assert f"rendezvous rrnode1:{rdzv.port}" in logs[name], logs[name][:2000]
        assert rdzv.id not in logs[name]
        assert final(tmp_path / name)["status"] == "completed"
        assert (tmp_path / f"{name}.rendezvous").exists(), "a rendezvous file the job did not draw was removed"
    agents = [line for line in lines.seen if "launchers.torchrun.node" in line]
    assert agents, lines.seen
    assert not any(rdzv.id in line or f":{rdzv.port}" in line for line in lines.seen for rdzv in drawn), agents


def read_logs(tmp_path, jobs) -> str:
    parts = []
    for name, job in jobs.items():
        path = tmp_path / f"{name}.log"
        parts.append(f"--- job {job} ({name}.log)\n" + (path.read_text()[-4000:] if path.exists() else "(none)"))
    return "\n".join(parts)
