"""One writer per run directory: a lock file naming its holder (host, pid, job id).

A second copy of a run (an accidental double submission, a requeued job whose old copy is still shutting
down) waits up to `run.lock_wait_s` for the lock and then exits with status 73 without writing anything into
the directory. A lock whose holder is gone is taken over: on the same host, the holder's pid is dead (or now
belongs to another process); from another host, its heartbeat (the file's mtime, touched every
`HEARTBEAT_S`) is older than `STALE_S`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from rrtrain.rundir import fields, layout

LOCK_NAME = layout.LOCK
LOCKED_EXIT = 73  # EX_CANTCREAT: another copy of this run holds its directory
HEARTBEAT_S = 10.0
STALE_S = 60.0
POLL_S = 0.5


class RunLocked(Exception):
    """Another live process holds the run directory."""


def job_id() -> Optional[str]:
    """The scheduler's id of this job (array jobs as ARRAY_TASK), or None outside Slurm."""
    env = os.environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def _start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (tells a live holder from a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def read(run_dir: str | os.PathLike[str]) -> Optional[dict[str, Any]]:
    """The lock's content, or None when there is no (readable) lock: a lock that is not a JSON object names no
    holder."""
    path = Path(run_dir) / LOCK_NAME
    try:
        info = json.loads(path.read_text())
        if not isinstance(info, dict):
            return None
        info["heartbeat"] = path.stat().st_mtime
        return info
    except (OSError, ValueError):
        return None


def holder_alive(info: dict[str, Any]) -> bool:
    """Whether the process named by a lock still runs (same host: its pid; elsewhere: a fresh heartbeat)."""
    if info.get("host") == socket.gethostname():
        pid = fields.integer(info.get("pid"))
        if pid is None or pid <= 0:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        started = info.get("pid_start")
        return started is None or _start_time(pid) in (None, started)
    return time.time() - (fields.number(info.get("heartbeat")) or 0.0) < STALE_S


def describe(info: dict[str, Any]) -> str:
    job = f", job {info['job_id']}" if info.get("job_id") else ""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(fields.number(info.get("started")) or 0))
    return f"host {info.get('host')} pid {info.get('pid')}{job}, since {since}"


class RunLock:
    """The lock on one run directory, held by this process until `release()`."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.nonce = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _content(self) -> bytes:
        pid = os.getpid()
        info = {"host": socket.gethostname(), "pid": pid, "pid_start": _start_time(pid), "job_id": job_id(),
                "started": time.time(), "nonce": self.nonce}
        return (json.dumps(info) + "\n").encode()

    def _try_create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(self._content())
            f.flush()
            os.fsync(f.fileno())
        return True

    def _take_over_stale(self, seen: dict[str, Any]) -> None:
        """Remove a dead holder's lock, under a guard so two contenders cannot both remove one another's."""
        with open(self.run_dir / f".{LOCK_NAME}.guard", "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            now = read(self.run_dir)
            if now is not None and now.get("nonce") == seen.get("nonce") and not holder_alive(now):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)

    def acquire(self, wait_s: float) -> "RunLock":
        """Take the lock, waiting up to `wait_s` seconds for a live holder; raises RunLocked."""
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            if self._try_create():
                self._start_heartbeat()
                return self
            info = read(self.run_dir)
            if info is not None and not holder_alive(info):
                self._take_over_stale(info)
                continue
            if time.monotonic() >= deadline:
                who = describe(info) if info else "another process"
                raise RunLocked(f"run directory {self.run_dir} is locked by {who}: another copy of this run is "
                                f"training there; waited {wait_s:g} s (run.lock_wait_s), leaving it alone")
            time.sleep(POLL_S)

    def _start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(HEARTBEAT_S):
                with contextlib.suppress(OSError):
                    os.utime(self.path)

        self._thread = threading.Thread(target=beat, name="rrtrain-runlock", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Give the lock up (only if it is still ours)."""
        self._stop.set()
        info = read(self.run_dir)
        if info is not None and info.get("nonce") == self.nonce:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def hold(run_dir: Path, wait_s: float, is_main: bool, device: Any) -> Optional[RunLock]:
    """Rank 0 takes the lock; every rank learns the outcome, and all raise RunLocked together if it failed."""
    import torch

    from rrtrain.core import dist

    lock, error = None, None
    if is_main:
        try:
            lock = RunLock(run_dir).acquire(wait_s)
        except (RunLocked, OSError) as err:  # OSError (an unwritable dir): raised below, once the others know
            error = err
    failed = dist.all_reduce(torch.tensor([1.0 if error else 0.0], device=device), "max")
    if failed.item() > 0:
        raise error or RunLocked(f"run directory {run_dir}: rank 0 could not take its lock")
    return lock
