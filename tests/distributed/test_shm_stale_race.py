"""Two ranks of one run open their dataset while a dead run's shared memory lies in /dev/shm (a requeue after
SIGKILL, the chaos test): the local leader unlinks it, and no rank may look for a free streaming prefix before
the leader is done. One did: its look mapped the dead names (streaming keeps what it opens until exit), so the
leader judged them alive and left them for good, and a look that raced the leader's unlinking could take
another prefix than the leader registered ("shared memory prefix=N was not registered by local leader")."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from trainutil import PY, REPO, env, free_port

pytestmark = pytest.mark.distributed

WORKER = """
import fcntl, os, sys, time
import torch.distributed as dist
import rrtrain.data.shm as shm
from rrtrain.core.lazy_import import streaming_module
from rrtrain.data.loader import TrainLoader

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    prefix = streaming_module("streaming.base.shared.prefix")
    constant = streaming_module("streaming.base.constant")
    with open(shm.SHM_LOCK, "a") as lock:  # no other run takes or probes a prefix meanwhile
        fcntl.flock(lock, fcntl.LOCK_EX)
        free = max(prefix._check_and_find([sys.argv[1]], [None], name) for name in constant.SHM_TO_CLEAN)
        dead = f"/dev/shm/{free:06d}_{constant.BARRIER}"
        with open(dead, "wb") as fh:  # a dead run's name, mapped by nobody
            fh.write(bytes(64))
        planted = os.stat(dead).st_ino  # the new dataset makes a segment of that name again: tell them apart
    real = shm.unlink_stale

    def slow_unlink_stale(*args, **kwargs):
        time.sleep(3)  # a leader slow to clean up: a rank that does not wait for it looks too early
        return real(*args, **kwargs)

    shm.unlink_stale = slow_unlink_stale
dist.barrier()
TrainLoader(sys.argv[1], micro_batch=2, global_batch=4, rank=rank, world_size=2, local_rank=rank, seed=0,
            cache_dir=sys.argv[2])
dist.barrier()
if rank == 0:
    try:
        left = os.stat(dead).st_ino == planted
    except FileNotFoundError:
        left = False
    if left:
        sys.exit(f"{dead} is left behind")
sys.stdout.write(f"opened {rank}\\n")  # one write: the two ranks' lines do not interleave
sys.stdout.flush()
"""


def test_no_rank_looks_for_a_prefix_while_the_leader_unlinks_dead_ones(stories_data, tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    cmd = [PY, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={free_port()}", str(worker), str(stories_data), str(tmp_path / "cache")]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    assert proc.returncode == 0, out[-3000:]
    assert "opened 0" in out and "opened 1" in out
