"""Ranks of a test's own worker module (tests/distributed/*_worker.py), started as `trainutil.start_ranks` starts
a training run's: srun-style (MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE; no torchrun
agent), each forked by the tests' fork server where one serves (tests/forkserver.py), else a plain process. For
the tests whose claim is what the ranks compute, not how a launcher starts them: a fresh interpreter per rank
and one more for torchrun's agent cost 3-4 s of CPU each, a fork ~0.3 s. Also what a test that SIGKILLs such a
job (a training run's ranks from `trainutil.start_ranks`) waits and kills with (`wait_for_step`, `kill_ranks`).
Imported by path under tests/ (`from distributed.rankutil import run_ranks`)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Optional

import trainutil
from trainutil import PY, Process, env, free_port, losses, wait_ranks


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


def wait_for_step(run_dir: Path, step: int, procs: list[Process], timeout: float = 300) -> int:
    """`trainutil.wait_for_step` for a job of srun-style ranks (`trainutil.start_ranks`): the first training line
    of at least `step`, failing as soon as any rank has ended."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ended = next((p for p in procs if p.poll() is not None), None)
        if ended is not None:
            out, err = ended.communicate()
            raise AssertionError(f"a rank ended (exit {ended.returncode}) before step {step}:\n{out[-3000:]}\n"
                                 f"{(err or '')[-3000:]}")
        seen = max(losses(run_dir), default=0)
        if seen >= step:
            return seen
        time.sleep(0.02)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def kill_ranks(procs: list[Process]) -> None:
    """SIGKILL every rank's process tree at once, as SIGKILL to a torchrun job's process group takes every rank
    with it (srun-style ranks have a session each), then reap them."""
    trainutil.kill_all(procs)
    for proc in procs:
        proc.communicate()
