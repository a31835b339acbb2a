"""Host-wide state is per user, and no lock is waited on for ever.

A node of a shared cluster runs other users' jobs beside ours. A name every user can create (a lock file in
/dev/shm or /tmp) lets any of them stop every rrtrain run on the node (hold the lock) or make every start fail
(create it first, unreadable): so rrtrain's host-wide files live in a directory of the user's own,
`<shm>/rrtrain-<uid>`, mode 0700, checked before use (a link, a non-directory or a mode that lets others in is
refused in one line). That name is predictable, so a co-tenant may make it first: then the user's processes on
the host use a fresh 0700 directory beside it instead, recorded in `~/.rrtrain/hosts/<hostname>/` under a lock
so that they all agree on it (`private_host_dir`); `RRTRAIN_RUNTIME_DIR` names the directory explicitly. And
every wait for a lock, ours or a co-tenant's, ends: after `RRTRAIN_LOCK_WAIT_S` seconds (the one setting,
default `DEFAULT_LOCK_WAIT_S`) it is refused in one line naming the lock.
"""

from __future__ import annotations

import fcntl
import math
import os
import random
import socket
import stat
import tempfile
import time
from typing import IO, Optional, Union

from rrtrain.core import files
from rrtrain.core.errors import RunError, UsageError

#: the environment variable that bounds every wait for a lock, in seconds
LOCK_WAIT_ENV = "RRTRAIN_LOCK_WAIT_S"

#: the environment variable that names the user's host-wide directory explicitly (unset: `private_runtime_dir`)
RUNTIME_DIR_ENV = "RRTRAIN_RUNTIME_DIR"

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
    """This user's directory for host-wide state: `RRTRAIN_RUNTIME_DIR` when set (checked private along its
    path), else `private_host_dir(root, "rrtrain-<uid>")` (root: /dev/shm, else the temp dir). Every process of
    the user on the host must get the same directory (the shared-memory guard's locks live there), so it comes
    from nothing a process's own environment varies but that one explicit setting."""
    explicit = os.environ.get(RUNTIME_DIR_ENV) if root is None else None
    if explicit:
        if not os.path.isabs(explicit):
            raise UsageError(f"{RUNTIME_DIR_ENV}={explicit!r}: expected an absolute path (a directory of yours, "
                             "the same for every process of yours on this machine)")
        why = files.prepare_private_dir(explicit)
        if why is not None:
            raise UsageError(f"{RUNTIME_DIR_ENV}={explicit}: {why}: rrtrain keeps its per-user locks there; "
                             "choose a directory no one else can write")
        return os.path.abspath(explicit)
    return private_host_dir(_shm_root() if root is None else root, f"rrtrain-{os.geteuid()}")


def private_host_dir(root: str, name: str, what: str = "rrtrain's per-user locks") -> str:
    """`<root>/<name>` (root: a directory every user writes, such as /dev/shm or /tmp), made 0700 when missing;
    when another user made that predictable name first, a fresh 0700 directory beside it (`mkdtemp`) whose name
    is kept in `host_state_dir()`, so that a co-tenant who squats the name stops nothing and every process of
    the user on the host still agrees on one directory. One of the user's own that is a link, not a directory,
    or open to others is refused in one line (rrtrain makes it 0700 itself: something else made it)."""
    path = os.path.join(root, name)
    if _claim(path, what):
        return path
    return _redirected(root, name, path, what)


def _claim(path: str, what: str) -> bool:
    """True when `path` is (now) the user's private directory; False when another user holds the name."""
    uid = os.geteuid()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise UsageError(f"cannot make {path} for {what}: {err.strerror or err}") from None
    try:
        st = os.lstat(path)
    except OSError as err:
        raise UsageError(f"cannot use {path} for {what}: {err.strerror or err}") from None
    if st.st_uid != uid:
        return False  # a co-tenant's: theirs to keep, ours to avoid
    why = _unfit(st)
    if why:
        raise UsageError(f"{path} {why}: rrtrain keeps {what} there; remove it (rrtrain makes it 0700 itself)")
    return True


def _unfit(st: os.stat_result) -> str:
    """Why a directory of the user's own, as `lstat` saw it, cannot hold private state ("" when it can)."""
    return ("is a symbolic link" if stat.S_ISLNK(st.st_mode) else
            "is not a directory" if not stat.S_ISDIR(st.st_mode) else
            f"has mode {stat.S_IMODE(st.st_mode):04o} (others may use it)" if st.st_mode & 0o077 else "")


def host_state_dir() -> str:
    """`~/.rrtrain/hosts/<hostname>`: where the user's processes on this host record the directories they use
    instead of a name a co-tenant took (the home is the user's own; the host name keeps nodes that share it
    apart)."""
    return os.path.join(os.path.expanduser("~"), ".rrtrain", "hosts", socket.gethostname())


def _redirected(root: str, name: str, taken: str, what: str) -> str:
    """The directory recorded for `name` in `host_state_dir()`, or a fresh one made and recorded, under a lock
    there, so that every process of the user on the host takes the same one. A record whose directory is gone
    (a reboot emptied /dev/shm) or is no longer the user's private one in `root` is replaced."""
    state = host_state_dir()
    owner = _owner(taken)
    why = files.prepare_private_dir(state)
    if why is not None:
        raise UsageError(f"{taken} belongs to another user (uid {owner}) and {state}, where rrtrain would record "
                         f"a directory of yours instead, is unusable: {why}")
    pointer = os.path.join(state, name)
    try:
        lock = os.fdopen(files.open_lock_file(pointer + ".lock", 0o600), "r+b")
    except OSError as err:
        raise UsageError(f"{pointer}.lock cannot be a lock ({err.strerror or err}): remove it "
                         "(rrtrain makes it)") from None
    with lock:
        flock_within(lock, f"the lock {pointer}.lock")
        recorded = _recorded(pointer, root)
        if recorded is not None:
            return recorded
        try:
            made = tempfile.mkdtemp(prefix=f"{name}.", dir=root)
        except OSError as err:
            raise UsageError(f"cannot make a directory in {root} for {what}: {err.strerror or err}") from None
        files.atomic_write_file(pointer, made + "\n", mode=0o600)
        return made


def _owner(path: str) -> object:
    try:
        return os.lstat(path).st_uid
    except OSError:
        return "?"


def _recorded(pointer: str, root: str) -> Optional[str]:
    """The directory `pointer` names when it is still the user's private directory directly in `root`."""
    try:
        text = files.read_bytes(pointer, 4096).decode("utf-8", "replace").strip()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise UsageError(f"{pointer} cannot be read ({err.strerror or err}): remove it (rrtrain makes it)") from None
    if not text or os.path.dirname(text) != os.path.abspath(root):
        return None
    try:
        st = os.lstat(text)
    except OSError:
        return None
    return text if st.st_uid == os.geteuid() and not _unfit(st) else None


def open_private_lock(name: str, root: Optional[str] = None) -> IO[bytes]:
    """The lock file `name` in `private_runtime_dir()`, 0600, never through a link and only a regular file."""
    path = os.path.join(private_runtime_dir(root), name)
    try:
        return os.fdopen(files.open_lock_file(path, 0o600), "r+b")
    except OSError as err:
        raise UsageError(f"{path} cannot be a lock ({err.strerror or err}): remove it (rrtrain makes it)") from None
