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

from distributed.rankutil import rank_env, spawn_module
from trainutil import free_port

pytestmark = pytest.mark.distributed

WAIT_S = 60  # a deadlock never ends; the runs take a few seconds


def test_two_runs_across_the_same_two_machines_do_not_deadlock(tmp_path):
    locks = [str(tmp_path / f"machine{m}.lock") for m in (0, 1)]
    procs = []
    for machines in (locks, locks[::-1]):  # run A: ranks on machines 0, 1; run B: on 1, 0
        port = free_port()
        for rank in (0, 1):  # each rank alone on its machine; forked by the tests' fork server (rankutil)
            procs.append(spawn_module("tests.distributed.shm_guard_worker", machines,
                                      rank_env(rank, 2, port, local=(0, 1)), merge_stderr=True))
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
