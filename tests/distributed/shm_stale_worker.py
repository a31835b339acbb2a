"""A rank of tests/distributed/test_shm_stale_race.py: `python -m tests.distributed.shm_stale_worker DATA CACHE` on each
of 2 ranks of an env:// launch (tests/distributed/rankutil.py). Once the run holds the machine's lock, rank 0 plants
a dead run's shared-memory names at the first free prefix and the leader is slow to unlink them; both ranks then
open the dataset, and rank 0 fails if the dead names are left behind."""

import os, sys, time
import torch.distributed as dist
import rrtrain.data.shm as shm
from rrtrain.core.lazy_import import streaming_module
from rrtrain.data.loader import TrainLoader

dist.init_process_group("gloo")
rank = dist.get_rank()
dead = planted = None
prefix = streaming_module("streaming.base.shared.prefix")
constant = streaming_module("streaming.base.constant")
real_lock, real_unlink_stale = shm._lock_on_every_machine, shm.unlink_stale


def lock_then_plant(handle):
    # once the run holds the machine's lock (no other run probes a prefix until the dataset is open), rank 0
    # plants a dead run's names, mapped by nobody, at the first free prefix; both ranks go on when it is done
    global dead, planted
    real_lock(handle)
    if rank == 0:
        free = max(prefix._check_and_find([sys.argv[1]], [None], name) for name in constant.SHM_TO_CLEAN)
        with open(f"/dev/shm/{free:06d}_{constant.LOCALS}", "wb") as fh:
            fh.write(prefix._pack_locals(["/nowhere"], free))
        dead = f"/dev/shm/{free:06d}_{constant.BARRIER}"
        with open(dead, "wb") as fh:
            fh.write(bytes(64))
        planted = os.stat(dead).st_ino  # the new dataset makes a segment of that name again: tell them apart
    dist.barrier()


def slow_unlink_stale(*args, **kwargs):
    time.sleep(3)  # a leader slow to clean up: a rank that does not wait for it looks too early
    return real_unlink_stale(*args, **kwargs)


shm._lock_on_every_machine, shm.unlink_stale = lock_then_plant, slow_unlink_stale
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
sys.stdout.write(f"opened {rank}\n")  # one write: the two ranks' lines do not interleave
sys.stdout.flush()
