"""A rendezvous port per job: two 2-node jobs of slurm/multinode.sbatch on the same two nodes (so with the same
head node) run at the same time and both finish. With the old fixed port (29500) the second job's rendezvous
would meet the first job's store. One rank per node, a few steps: the point is the rendezvous. Both jobs also
take both nodes' streaming locks at the same moment: when each node's lock was taken blocking and held across
the job's barriers, the two jobs could each hold one and wait for the other for good (now
tests/distributed/test_shm_guard_machines.py)."""

from __future__ import annotations

import time

import pytest

from slurmutil import NODES, REPO, cancel, sbatch, squeue, wait_done
from trainutil import PY, TINY, env, final

pytestmark = pytest.mark.distributed

ARGS = ["train.max_steps=4", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=0",
        "train.global_batch=8", "train.micro_batch=4", "train.warmup_steps=2", "parallel.backend=fsdp"]


def test_two_jobs_sharing_a_head_node_each_get_their_port(slurm_cluster, tmp_path, stories_data):
    e = env()
    e.update(RRTRAIN_PYTHON=PY, RRTRAIN_NPROC_PER_NODE="1")
    jobs = {}
    for name in ("a", "b"):
        run = tmp_path / name
        jobs[name] = sbatch(REPO / "slurm" / "multinode.sbatch", f"--nodes={NODES}", "--ntasks-per-node=1",
                            "--cpus-per-task=1", "--mem=1G", "--time=10", f"--output={tmp_path / name}.log",
                            args=(TINY, f"data.path={stories_data}", f"run.dir={run}", *ARGS),
                            env={**e, "RRTRAIN_RUN_DIR": str(run)})
    try:
        together, deadline = False, time.time() + 300
        while time.time() < deadline and not together:
            states = [squeue(j).get(j) for j in jobs.values()]
            together = states == ["RUNNING", "RUNNING"]
            if any(s not in ("PENDING", "CONFIGURING", "RUNNING") for s in states):
                break
            time.sleep(0.5)
        try:
            done = {name: wait_done(job, timeout=300)[job] for name, job in jobs.items()}
        except AssertionError as err:
            raise AssertionError(f"{err}\n{read_logs(tmp_path, jobs)}") from None
    finally:
        cancel(*jobs.values())
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in jobs}
    assert together, "the two jobs never ran at the same time"
    assert done == {"a": "COMPLETED", "b": "COMPLETED"}, "\n".join(t[-3000:] for t in logs.values())
    ports = {name: 20000 + int(job) % 10000 for name, job in jobs.items()}
    assert ports["a"] != ports["b"]
    for name in jobs:
        assert f"rendezvous rrnode1:{ports[name]}" in logs[name], logs[name][:2000]
        assert final(tmp_path / name)["status"] == "completed"


def read_logs(tmp_path, jobs) -> str:
    parts = []
    for name, job in jobs.items():
        path = tmp_path / f"{name}.log"
        parts.append(f"--- job {job} ({name}.log)\n" + (path.read_text()[-4000:] if path.exists() else "(none)"))
    return "\n".join(parts)
