"""Host-wide state is per user, and no lock is waited on for ever.

A node of a shared cluster runs other users' jobs beside ours. A name every user can create (a lock file in
/dev/shm or /tmp) lets any of them stop every rrtrain run on the node (hold the lock) or make every start fail
(create it first, unreadable): so rrtrain's host-wide files live in a directory of the user's own,
`<shm>/rrtrain-<uid>`, mode 0700, checked before use (a link, another owner or a mode that lets others in is
refused in one line). And every wait for a lock, ours or a co-tenant's, ends: after `RRTRAIN_LOCK_WAIT_S`
seconds (the one setting, default `DEFAULT_LOCK_WAIT_S`) it is refused in one line naming the lock.
"""

from __future__ import annotations

import fcntl
import math
import os
import random
import stat
import tempfile
import time
from typing import IO, Optional, Union

from rrtrain.core.errors import RunError, UsageError
from rrtrain.core.files import open_lock_file

#: the environment variable that bounds every wait for a lock, in seconds
LOCK_WAIT_ENV = "RRTRAIN_LOCK_WAIT_S"

#: a wait's bound when the variable is not set: long enough for a run that holds the machine's streaming lock
#: while it opens a large dataset, short enough that a wedged holder does not eat a job's time limit
DEFAULT_LOCK_WAIT_S = 300.0


class LockTimeout(RunError):
    """A lock stayed held past its deadline: one line, and the command or run ends (a run as `failed`)."""


def lock_wait_s() -> float:
    """The deadline of a lock wait, from `RRTRAIN_LOCK_WAIT_S` (seconds, > 0)."""
    raw = os.environ.get(LOCK_WAIT_ENV)
    if raw is None or raw == "":
        return DEFAULT_LOCK_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"{LOCK_WAIT_ENV}={raw!r}: expected a number of seconds > 0")
    return value


def flock_within(handle: Union[int, IO[bytes]], what: str, wait_s: Optional[float] = None) -> None:
    """Take the exclusive `flock` of `handle`, waiting at most `wait_s` (default `lock_wait_s()`); past it,
    `LockTimeout` names `what`. Polls without blocking, so a signal handler's flag is seen between tries."""
    wait_s = lock_wait_s() if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    pause = 0.005
    rng = random.Random()  # a pause of its own per waiter: contenders must not retry in step
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        left = deadline - time.monotonic()
        if left <= 0:
            raise LockTimeout(f"{what} is still held by another process after {wait_s:g} s ({LOCK_WAIT_ENV}); "
                              "is a run of yours stuck on this machine?")
        time.sleep(min(left, rng.uniform(pause / 2, pause)))
        pause = min(pause * 2, 0.25)


def _shm_root() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def private_runtime_dir(root: Optional[str] = None) -> str:
    """This user's directory for host-wide state, `<root>/rrtrain-<uid>` (root: /dev/shm, else the temp dir),
    created 0700 when missing. One that is a link, is not a directory, belongs to someone else or lets
    anyone else write or read it is refused in one line: its name is predictable, so a co-tenant may have made
    it first."""
    root = _shm_root() if root is None else root
    uid = os.geteuid()
    path = os.path.join(root, f"rrtrain-{uid}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise UsageError(f"cannot make {path} for rrtrain's locks: {err.strerror or err}") from None
    try:
        st = os.lstat(path)
    except OSError as err:
        raise UsageError(f"cannot use {path} for rrtrain's locks: {err.strerror or err}") from None
    why = ("is a symbolic link" if stat.S_ISLNK(st.st_mode) else
           "is not a directory" if not stat.S_ISDIR(st.st_mode) else
           f"belongs to uid {st.st_uid}" if st.st_uid != uid else
           f"has mode {stat.S_IMODE(st.st_mode):04o} (others may use it)" if st.st_mode & 0o077 else "")
    if why:
        raise UsageError(f"{path} {why}: rrtrain keeps its per-user locks there; remove it (rrtrain makes it "
                         "0700 itself)")
    return path


def open_private_lock(name: str, root: Optional[str] = None) -> IO[bytes]:
    """The lock file `name` in `private_runtime_dir()`, 0600, never through a link and only a regular file."""
    path = os.path.join(private_runtime_dir(root), name)
    try:
        return os.fdopen(open_lock_file(path, 0o600), "r+b")
    except OSError as err:
        raise UsageError(f"{path} cannot be a lock ({err.strerror or err}): remove it (rrtrain makes it)") from None
