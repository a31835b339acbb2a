"""Ranks of a test's own worker module (tests/distributed/*_worker.py), started as `trainutil.start_ranks` starts
a training run's: srun-style (MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; no torchrun
agent), each forked by the tests' fork server where one serves (tests/forkserver.py), else a plain process. For
the tests whose claim is what the ranks compute, not how a launcher starts them: a fresh interpreter per rank
and one more for torchrun's agent cost 3-4 s of CPU each, a fork ~0.3 s. Imported by path under tests/
(`from distributed.rankutil import run_ranks`)."""

from __future__ import annotations

import subprocess
from typing import Optional

import trainutil
from trainutil import PY, Process, env, free_port, wait_ranks


def spawn_module(module: str, args: list[str], environ: dict[str, str], merge_stderr: bool = False) -> Process:
    """`python -m module *args` in the repository, in a session of its own, stdout and stderr piped (merged or
    not): forked by the fork server that serves `environ` (as `trainutil.spawn` forks a training run), else a
    plain subprocess (no server, RRTRAIN_TEST_FORKSERVER=0, the fast tier)."""
    return trainutil.spawn([PY, "-m", module, *args], environ, merge_stderr, module=module)


def rank_env(rank: int, world: int, port: int, local: Optional[tuple[int, int]] = None) -> dict[str, str]:
    """The environment of rank `rank` of `world` meeting at 127.0.0.1:`port`; `local`: (LOCAL_RANK,
    LOCAL_WORLD_SIZE), by default every rank on this one node."""
    local_rank, local_world = local if local is not None else (rank, world)
    e = env()
    e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
             LOCAL_RANK=str(local_rank), LOCAL_WORLD_SIZE=str(local_world))
    return e


def start_ranks(module: str, args: list[str], world: int) -> list[Process]:
    port = free_port()
    return [spawn_module(module, args, rank_env(rank, world, port)) for rank in range(world)]


def run_ranks(module: str, args: list[str], world: int, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `world` ranks of `module` to their end (`trainutil.wait_ranks`: the first to fail ends the others):
    the job's exit status and the ranks' stdout and stderr, rank after rank."""
    status, out, err = wait_ranks(start_ranks(module, args, world), timeout)
    return subprocess.CompletedProcess([PY, "-m", module, *args], status, out, err)
