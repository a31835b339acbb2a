"""Streaming's shared memory on one machine: one process at a time takes a name, and only dead runs' names go.

MosaicML streaming keeps each dataset's state in /dev/shm segments named `NNNNNN_<kind>`, the prefix NNNNNN
being the first one free when the dataset was opened. Two things go wrong on a machine that runs several
trainings at once (a sweep's parallel runs, a job array, a test suite):
- two datasets opened at the same moment take the same prefix (`FileExistsError: '/000064_locals'`):
  `shm_guard` serialises that per machine with a file lock;
- a run SIGKILLed mid-read leaks its segments, and a requeued successor with the same cache dir is refused.
  Streaming's own cleaner unlinks every segment from prefix 0 up to the first free one, live runs' included
  (their later workers and ranks cannot attach, and the next dataset may take their prefix), and stops at the
  first gap, so names above it leak for good. `unlink_stale` removes the segments of every prefix whose run
  is gone (`live_prefixes`), above gaps too, and nothing else.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import threading
from typing import Iterator

import torch

from rrtrain.core.lazy_import import streaming_module

#: one process per machine at a time makes or probes streaming's shared-memory names (see `shm_guard`)
SHM_LOCK = "/dev/shm/rrtrain-streaming.lock" if os.path.isdir("/dev/shm") else os.path.join(tempfile.gettempdir(),
                                                                                          "rrtrain-streaming.lock")

_shm_lock = threading.Lock()
_shm_cleaned = False


@contextlib.contextmanager
def shm_guard(local_rank: int = 0) -> Iterator[None]:
    """Serialise, per machine, what creates or probes streaming's shared-memory names.

    `StreamingDataset` registers the first free prefix: two runs starting together on one machine collide
    there. The local leader holds a file lock in /dev/shm; the other local ranks of its run wait at a barrier
    until it has it, so their look-ups run under it too. Every rank of a run must enter together (as
    streaming's own barriers require already)."""
    leader = int(os.environ.get("LOCAL_RANK", local_rank)) == 0
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    handle = open(SHM_LOCK, "a") if leader else None
    try:
        if handle is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        if distributed:
            torch.distributed.barrier()
        yield
        if distributed:
            torch.distributed.barrier()
    finally:
        if handle is not None:
            handle.close()  # releases the lock


def in_use(shm_dir: str = "/dev/shm", proc: str = "/proc") -> set[str]:
    """Names in `shm_dir` that a live process maps or holds open, as far as `proc` lets us see (another
    user's processes may be hidden, but their segments are not ours to unlink either)."""
    prefix = shm_dir.rstrip("/") + "/"
    names: set[str] = set()
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(os.path.join(proc, pid, "maps")) as maps:
                for line in maps:
                    at = line.find(prefix)
                    if at >= 0:  # "... /dev/shm/000000_locals" or "... /dev/shm/000000_locals (deleted)"
                        names.add(line[at + len(prefix):].split()[0])
            fd_dir = os.path.join(proc, pid, "fd")
            for fd in os.listdir(fd_dir):
                target = os.readlink(os.path.join(fd_dir, fd))
                if target.startswith(prefix):
                    names.add(target[len(prefix):].split()[0])
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return names


def live_prefixes(names: list[str], used: set[str]) -> set[str]:
    """The streaming prefixes of `names` whose run is alive.

    Every process that opens a dataset maps the `_locals` segment of every prefix on the machine, to compare
    local dirs, and keeps it until exit: a `_locals` in use says nothing about its own run. The other segments
    (barrier, epoch state, cache usage, ...) are opened by their run's processes alone, so one of them in use
    means the run lives. A prefix that has nothing but its `_locals` is judged by that."""
    by_prefix: dict[str, list[str]] = {}
    for name in names:
        by_prefix.setdefault(name[:6], []).append(name)
    live = set()
    for prefix, own in by_prefix.items():
        others = [n for n in own if not n.endswith("_locals")]
        if any(n in used for n in (others or own)):
            live.add(prefix)
    return live


def unlink_stale(shm_dir: str = "/dev/shm", proc: str = "/proc") -> int:
    """Unlink every streaming shared-memory name in `shm_dir` whose run is no longer alive; returns how many.

    Call it where a dataset is opened: on the local leader, under `shm_guard` (no other rrtrain process takes
    a name meanwhile)."""
    constant = streaming_module("streaming.base.constant")
    pattern = re.compile(r"\d{6}_(" + "|".join(map(re.escape, constant.SHM_TO_CLEAN)) + ")")
    try:
        names = [n for n in os.listdir(shm_dir) if pattern.fullmatch(n)]
    except OSError:
        return 0
    live = live_prefixes(names, in_use(shm_dir, proc)) if names else set()
    removed = 0
    for name in names:
        if name[:6] in live:
            continue
        try:
            os.unlink(os.path.join(shm_dir, name))
            removed += 1
        except OSError:
            pass  # gone meanwhile, or not ours to remove
    return removed


def clean_stale_shm(local_rank: int = 0) -> None:
    """Remove shared memory leaked by dead streaming runs, once per process, before any dataset; every rank
    calls it (inside `shm_guard`, whose barrier makes the other local ranks wait for the leader).

    Where there is no /dev/shm (not Linux), streaming's own cleaner is all there is: it unlinks on local
    rank 0 (streaming reads $LOCAL_RANK; launchers that do not set it get ours) and waits at a barrier."""
    global _shm_cleaned
    with _shm_lock:
        if _shm_cleaned:
            return
        leader = int(os.environ.get("LOCAL_RANK", local_rank)) == 0
        if os.path.isdir("/dev/shm") and os.path.isdir("/proc"):
            if leader:
                unlink_stale()
        else:
            had_env = "LOCAL_RANK" in os.environ
            if not had_env:
                os.environ["LOCAL_RANK"] = str(local_rank)
            try:
                streaming_module("streaming.base.util").clean_stale_shared_memory()
            finally:
                if not had_env:
                    del os.environ["LOCAL_RANK"]
        _shm_cleaned = True
