"""A rank of tests/distributed/test_shm_guard_machines.py: `python -m tests.distributed.shm_guard_worker LOCK0 LOCK1`
under env:// (RANK, WORLD_SIZE 2, MASTER_ADDR/PORT): this rank's "machine" is the lock file of its rank's index;
rank 1 waits until rank 0 of each run holds its machine's lock, then both pass `shm_guard`."""

import sys, time
import torch.distributed as dist
import rrtrain.data.shm as shm

dist.init_process_group("gloo")
rank = dist.get_rank()
shm.SHM_LOCK = sys.argv[1 + rank]  # this rank's machine
if rank == 1:
    time.sleep(4)  # rank 0 of each run holds its machine's lock by now
with shm.shm_guard():
    time.sleep(0.3)  # streaming's look-up, under the lock
print(f"through {rank}", flush=True)
dist.destroy_process_group()
