"""Two runs that each span two machines, on the same two machines, open their datasets at the same time.
`shm_guard` holds each machine's streaming lock over barriers of the whole run; when each leader blocked on
its own machine's lock, run A could hold machine 0's lock waiting for its leader on machine 1, who waited for
the lock run B held there, while B's leader on machine 0 waited for A's: both jobs hung for good (two 2-node
jobs of slurm/multinode.sbatch did, tests/slurm/test_rendezvous_ports.py). Here each rank is the leader of
its own "machine", a lock file of its own (4 plain processes under gloo: one run's ranks are its leaders on
machine 0 and 1, the other's on machine 1 and 0); rank 0 of each run takes its lock first, so that without
the fix the two runs deadlock every time."""

from __future__ import annotations

import subprocess

import pytest

from trainutil import PY, REPO, env, free_port

pytestmark = pytest.mark.distributed

WORKER = """
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
"""
WAIT_S = 60  # a deadlock never ends; the runs take a few seconds


def test_two_runs_across_the_same_two_machines_do_not_deadlock(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    locks = [str(tmp_path / f"machine{m}.lock") for m in (0, 1)]
    procs = []
    for machines in (locks, locks[::-1]):  # run A: ranks on machines 0, 1; run B: on 1, 0
        port = free_port()
        for rank in (0, 1):
            e = env()
            e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0",
                     LOCAL_WORLD_SIZE="1")
            procs.append(subprocess.Popen([PY, str(script), *machines], cwd=REPO, env=e, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=WAIT_S)[0])
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the two runs did not get through shm_guard within {WAIT_S} s: a deadlock") from None
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0] * 4, "\n".join(o[-2000:] for o in outs)
    assert [o.strip().splitlines()[-1] for o in outs] == ["through 0", "through 1"] * 2, outs
