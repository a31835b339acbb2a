"""Process-group set-up and the few collectives the trainer needs.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; without them this is one process and every helper here
degrades to a local no-op. NCCL on CUDA, gloo on CPU, chosen automatically; collectives time out.
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_group_started = False  # see started_group
_rank0_store: object = None  # the store rank 0 serves the process group from (_serve_rank0_store), kept alive


def setup(timeout_s: int) -> DistInfo:
    """Initialise the default process group when launched by torchrun (or any env:// launcher)."""
    global _group_started
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if "RANK" in os.environ and not dist.is_initialized():
        _serve_rank0_store(rank, timeout_s)
        backend = "nccl" if device.type == "cuda" else "gloo"
        try:
            dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s),
                                    device_id=device if device.type == "cuda" else None)
        except RuntimeError as err:
            _explain_interface(err)
            raise
        _group_started = True
    return DistInfo(rank, world, local_rank, device)


def _serve_rank0_store(rank: int, timeout_s: int) -> None:
    """Under an env:// launcher without torchrun's agent store (submitit's srun tasks), rank 0 hosts the store
    the ranks meet at, and torch's would listen on every interface: start it on MASTER_ADDR's own address first
    (rrtrain.core.stores.serve_env_store). Under torchrun the agent hosts it (launchers/torchrun/store_binding.py)."""
    global _rank0_store
    if rank != 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if host and port.isdigit():
        from rrtrain.core.stores import serve_env_store

        _rank0_store = serve_env_store(host, int(port), timeout_s)


def _explain_interface(err: RuntimeError) -> None:
    """gloo refuses an interface name the host lacks with a C++ assertion; say which setting to change."""
    value = os.environ.get("GLOO_SOCKET_IFNAME")
    if value and "Unable to find address for" in str(err):
        import socket

        from rrtrain.core.errors import UsageError

        have = ", ".join(sorted(n for _, n in socket.if_nameindex()))
        raise UsageError(f"GLOO_SOCKET_IFNAME={value}: no such network interface on {socket.gethostname()} "
                         f"(it has {have}); set GLOO_SOCKET_IFNAME to the interface the nodes reach each other "
                         "on, or unset it") from None


def started_group() -> bool:
    """Whether `setup` started a process group in this process (it may be destroyed since)."""
    return _group_started


def teardown() -> None:
    global _rank0_store
    if dist.is_initialized():
        dist.destroy_process_group()
    _rank0_store = None


def exit_process(code: int) -> NoReturn:
    """End this process with exit status `code`, the run's objects freed first (streaming then releases its
    shared memory). Without a process group, plainly (`sys.exit`). After one, do what interpreter shutdown
    would do, in its order: destroy the group, finish non-daemon threads (`threading._shutdown`, as shutdown calls it),
    run atexit handlers, flush stdio; then `os._exit(code)` instead of finalising the interpreter.

    Why: a gloo worker thread can still be releasing a finished collective's tensors when the main thread
    returns; if Python has started finalising by then, that thread cannot take the GIL and the process
    aborts ("terminate called without an active exception", SIGABRT, pytorch/pytorch#190489). A run that had
    finished and written everything then reports a failure to torchrun and Slurm. FSDP keeps its groups (and
    their threads) alive past `destroy_process_group`, so they cannot be joined first."""
    import gc

    gc.collect()
    if not (_group_started or dist.is_initialized()):
        sys.exit(code)
    import atexit
    import threading

    teardown()
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce(t: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """In-place all-reduce (sum or max) when distributed; returns t."""
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t


def gather_objects(value: object) -> list:
    """Collective: every rank's `value` (small, picklable; sent over the process group), in rank order."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        found: list = [None] * dist.get_world_size()
        dist.all_gather_object(found, value)
        return found
    return [value]


def raise_together(problem: "str | None") -> None:
    """Collective: when any rank has a problem, every rank raises UsageError with the lowest such rank's
    message, so no rank is left waiting in a collective for one that has gone."""
    from rrtrain.core.errors import UsageError

    problem = next((p for p in gather_objects(problem) if p), None)
    if problem:
        raise UsageError(problem)
