"""A multi-node job that cannot form its group ends within a bounded time with a line naming the setting to
change, never a hang: a GLOO_SOCKET_IFNAME the nodes lack (every rank says so in one line and exits 2) and an
unreachable rendezvous host (the agents give up after RDZV_TIMEOUT_S). Both on 2 nodes, one rank each, at once."""

from __future__ import annotations

import time

import pytest

from slurmutil import NODES, REPO, cancel, sbatch, wait_done
from trainutil import PY, TINY, env

pytestmark = pytest.mark.distributed

ARGS = ["train.max_steps=2", "train.eval_every=0", "train.ckpt_every=0", "train.global_batch=8",
        "train.micro_batch=4", "parallel.backend=fsdp"]
TIMEOUT_S = 15  # RDZV_TIMEOUT_S of the unreachable-head job
BOUND_S = 150  # submission to the end of either job, start-up on 2 shared cores included


def test_wrong_interface_and_unreachable_head_end_in_one_line(slurm_cluster, tmp_path, stories_data):
    cases = {"ifname": {"GLOO_SOCKET_IFNAME": "bogus0"},
             "head": {"RDZV_HOST": "198.18.0.99", "RDZV_TIMEOUT_S": str(TIMEOUT_S)}}
    jobs, t0 = {}, time.time()
    for name, extra in cases.items():
        run = tmp_path / name
        e = {**env(), "RRTRAIN_PYTHON": PY, "RRTRAIN_NPROC_PER_NODE": "1", "RRTRAIN_RUN_DIR": str(run), **extra}
        jobs[name] = sbatch(REPO / "slurm" / "multinode.sbatch", f"--nodes={NODES}", "--ntasks-per-node=1",
                            "--cpus-per-task=1", "--mem=1G", "--time=10", f"--output={tmp_path / name}.log",
                            args=(TINY, f"data.path={stories_data}", f"run.dir={run}", *ARGS), env=e)
    try:
        states = {name: wait_done(job, timeout=BOUND_S)[job] for name, job in jobs.items()}
    finally:
        cancel(*jobs.values())
    took = time.time() - t0
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in jobs}
    assert states == {"ifname": "FAILED", "head": "FAILED"}, "\n".join(t[-3000:] for t in logs.values())
    assert took < BOUND_S
    lines = [line for line in logs["ifname"].splitlines() if line.startswith("rrtrain train: error:")]
    assert len(lines) == NODES and all("GLOO_SOCKET_IFNAME=bogus0: no such network interface on rrnode" in line
                                       for line in lines), logs["ifname"][-3000:]
    assert "rrtrain multinode: error: no rank started" in logs["ifname"]
    head = [line for line in logs["head"].splitlines() if line.startswith("rrtrain multinode: error:")]
    assert len(head) == 1 and "did not meet at 198.18.0.99:" in head[0] and "RDZV_HOST" in head[0], \
        logs["head"][-3000:]
