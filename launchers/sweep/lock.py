"""One writer per sweep directory.

`rrtrain sweep` holds an exclusive lock on `SWEEP_DIR/.sweep.lock` for a whole submission: from reading
`sweep.json` to recording the last job id (for the local and debug executors, until the last run ends). A
second `rrtrain sweep` on the same directory waits for it, at most `--lock-wait` seconds, then refuses with one
line naming the holder. Without it two submissions would both see a run as new and train it twice, and one
would replace the code snapshot the other's runs import.

Every read-modify-write of `sweep.json` (a submission recorded, a cancellation recorded by `rrtrain status`)
happens under a second, short lock, `SWEEP_DIR/.sweep.json.lock` (`record.update`), so no job id written by
one process is lost to another's older copy.

The locks are `flock(2)` locks: the kernel drops them when their holder exits, however it exits, so a crash
leaves no stale lock behind (the files stay, empty of meaning). They are opened without following a link,
so a planted symlink cannot make rrtrain truncate a file elsewhere. On NFS, Linux maps `flock` onto
byte-range locks that the server arbitrates across hosts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

from rrtrain.core import files
from rrtrain.core.errors import UsageError
from rrtrain.core.files import NotRegular, open_lock_file
from rrtrain.rundir import fields

SWEEP_LOCK = ".sweep.lock"
RECORD_LOCK = ".sweep.json.lock"
#: seconds a second `rrtrain sweep` waits for the first (its --lock-wait default)
DEFAULT_WAIT_S = 30.0
#: seconds a writer of sweep.json waits for another's read-modify-write (which takes milliseconds)
RECORD_WAIT_S = 60.0
POLL_S = 0.2


def _open(path: Path) -> int:
    """The lock file opened for writing, never through a symlink, and only when it is a regular file."""
    try:
        return open_lock_file(path)
    except NotRegular:
        raise UsageError(f"{path} is not a regular file: move it away (rrtrain makes this lock file itself)") from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UsageError(f"{path} is a symbolic link: move it away (rrtrain makes this lock file itself)") from None
        raise UsageError(f"cannot open the lock {path}: {err.strerror or type(err).__name__}") from None


def _try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def holder(path: Path) -> str:
    """Who holds the sweep lock, as its file says (text another process wrote: shown, never acted on)."""
    try:
        data = json.loads(files.read_bytes(path, 4096))
    except (OSError, ValueError, RecursionError):
        return "holder unknown"
    if not isinstance(data, dict):
        return "holder unknown"
    pid, host, since = fields.count(data.get("pid")), fields.text(data.get("host")), fields.finite(data.get("started"))
    when = time.strftime(" since %H:%M:%S", time.localtime(since)) if since is not None and 0 < since < 2**33 else ""
    return f"pid {pid if pid is not None else '?'} on {fields.short(host or '?', 64).strip(chr(39))}{when}"


@contextlib.contextmanager
def hold_sweep(out: Path, wait_s: float = DEFAULT_WAIT_S) -> Iterator[None]:
    """Hold the sweep directory's submission lock for the block; wait for another holder at most `wait_s`
    seconds (saying so once), then refuse with a UsageError naming it."""
    path = Path(out) / SWEEP_LOCK
    fd = _open(path)
    try:
        if not _try(fd):
            who = holder(path)
            print(f"rrtrain sweep: another rrtrain sweep ({who}) is submitting to {out}; waiting up to {wait_s:g} s "
                  "(--lock-wait)", file=sys.stderr, flush=True)
            deadline = time.monotonic() + wait_s
            while not _try(fd):
                if time.monotonic() >= deadline:
                    raise UsageError(f"another rrtrain sweep ({holder(path)}) is still submitting to {out} after "
                                     f"{wait_s:g} s (--lock-wait): run this one when it has ended")
                time.sleep(POLL_S)
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, me, 0)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def hold_record(out: Path, wait_s: float = RECORD_WAIT_S) -> Iterator[None]:
    """Hold the short lock around one read-modify-write of `sweep.json`."""
    path = Path(out) / RECORD_LOCK
    fd = _open(path)
    try:
        deadline = time.monotonic() + wait_s
        while not _try(fd):
            if time.monotonic() >= deadline:
                raise UsageError(f"{path} has been held for {wait_s:g} s by another process: cannot record "
                                 "into sweep.json")
            time.sleep(0.05)
        yield
    finally:
        os.close(fd)
