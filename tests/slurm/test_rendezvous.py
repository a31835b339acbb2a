"""Multi-node rendezvous without a second machine: two torchrun agents on this machine, each one "node"
(`--nnodes=2 --nproc_per_node=1`) meeting through a c10d rendezvous, train the same run as one agent with
two processes, with the same losses. This is the rendezvous slurm/multinode.sbatch uses across nodes.

Each agent gets a /dev/shm of its own (a private mount namespace, as a second machine would have):
streaming registers a shared-memory segment per node leader, and two leaders on one /dev/shm collide."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from trainutil import PY, REPO, TINY, env, final, free_port, losses, max_rel_diff, train

pytestmark = pytest.mark.distributed

ARGS = ["train.max_steps=6", "train.log_every=1", "train.eval_every=0", "train.ckpt_every=0",
        "train.global_batch=8", "train.micro_batch=4", "train.warmup_steps=2", "parallel.backend=fsdp"]


def agent(run_dir, data, port: int) -> subprocess.Popen:
    """One torchrun agent as one node, in its own mount namespace with a private /dev/shm."""
    node = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs -o size=512m tmpfs /dev/shm && exec "$@"', "node"]
    cmd = [*node, PY, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
           f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=rr-test", "--max_restarts=0",
           "-m", "rrtrain.train", TINY, f"data.path={data}", f"run.dir={run_dir}", *ARGS]
    return subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a private /dev/shm per agent needs root and unshare")
def test_two_agents_rendezvous_like_one_agent_with_two_processes(tmp_path, stories_data):
    one = tmp_path / "one-agent"
    train(one, stories_data, *ARGS, nproc=2)
    two = tmp_path / "two-agents"
    port = free_port()
    agents = [agent(two, stories_data, port) for _ in range(2)]
    try:
        outs = [a.communicate(timeout=300)[0] for a in agents]
    finally:
        for a in agents:
            a.kill()
    assert [a.returncode for a in agents] == [0, 0], "\n".join(o[-3000:] for o in outs)
    assert final(two)["world_size"] == 2 and final(two)["status"] == "completed"
    assert len(losses(two)) == 6
    assert max_rel_diff(losses(one), losses(two)) == 0.0
