"""One writer per run directory: a lock file naming its holder (host, pid, its start time, its command line,
job id), held open and `flock`-ed by the holder for as long as it holds the lock.

A second copy of a run (an accidental double submission, a requeued job whose old copy is still shutting
down) waits up to `run.lock_wait_s` for the lock and then exits with status 73 without writing anything into
the directory. A lock is honoured only while its holder proves itself. On the same host: the pid is alive,
its start time and command line are the ones the lock records, and the process holds the `flock` of this very
lock file (the kernel's lock table says so; no process but a `RunLock` holder takes it): a lock naming some
other live process, e.g. one with a reused pid or one an edited lock points at, proves nothing, is taken over,
and nothing signals it. From
another host, where none of that can be seen: its heartbeat (the file's mtime, touched every `HEARTBEAT_S`)
is younger than `STALE_S`. A lock written by an older rrtrain (no command line, no flock: `is_legacy`) is
honoured on the same host while the pid it names is alive with the recorded start time, runs an rrtrain
command, and the lock's heartbeat is fresh; it is never signalled. A lock file that is empty or not a JSON
object (a crash or a full disk between its creation and its write) is waited on while it is younger than
`STALE_S` and taken over after. A `run.lock` (or take-over guard) that is not a regular file is refused in
one line. Every take-over says so in one line on stderr (the run's log).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from rrtrain.core import files
from rrtrain.core.errors import UsageError
from rrtrain.core.host_locks import flock_within
from rrtrain.rundir import fields, layout, own_files

LOCK_NAME = layout.LOCK
#: a lock names its holder in well under a kB
MAX_LOCK_BYTES = files.LIMITS["lock"]
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
        stat = files.read_bytes(f"/proc/{pid}/stat", "proc").decode("utf-8", "surrogateescape")
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _cmdline(pid: int) -> Optional[list[str]]:
    """The process's command line (argv), or None when it cannot be read."""
    try:
        raw = files.read_bytes(f"/proc/{pid}/cmdline", "proc")
    except OSError:
        return None
    args = raw.split(b"\0")
    if args and args[-1] == b"":
        args.pop()
    return [a.decode("utf-8", "surrogateescape") for a in args] or None


def _holds_flock(pid: int, path: str | os.PathLike[str], inode: Optional[int] = None) -> Optional[bool]:
    """Whether the process holds the `flock` of the file at `path` (or of `inode`, the file read: then `path`
    is not looked at again) by the kernel's own table, /proc/locks: "N: FLOCK ADVISORY WRITE PID
    MAJ:MIN:INODE ..."; None when that table cannot be read. The table's device numbers are not stat(2)'s on
    every filesystem (btrfs): which device the file is on is proven by `_has_open`."""
    if inode is None:
        try:
            inode = os.lstat(path).st_ino
        except OSError:
            return False
    for fresh in (False, True):  # a recent copy of the table may say yes; only the current one may say no
        table = _lock_table(fresh)
        if table is None:
            return None
        for line in table.splitlines():
            parts = line.split()
            # an NFS client turns flock into a whole-file POSIX lock: it is listed as POSIX there
            if (len(parts) >= 6 and parts[1] in ("FLOCK", "POSIX") and parts[4] == str(pid)
                    and parts[5].rsplit(":", 1)[-1] == str(inode)):
                return True
    return False


_LOCK_TABLE: list[Any] = [0.0, None]  # when /proc/locks was last read, and what it said
LOCK_TABLE_TTL_S = 1.0


def _lock_table(fresh: bool) -> Optional[str]:
    """/proc/locks, read again unless `fresh` is false and the last read is under LOCK_TABLE_TTL_S old (`rrtrain
    status` asks about hundreds of runs at once); None when it cannot be read."""
    now = time.monotonic()
    if fresh or _LOCK_TABLE[1] is None or now - _LOCK_TABLE[0] > LOCK_TABLE_TTL_S:
        try:
            _LOCK_TABLE[:] = [now, files.read_bytes("/proc/locks", "proc").decode("utf-8", "surrogateescape")]
        except OSError:
            return None
    return _LOCK_TABLE[1]


def _read_open(fd: int, path: Path) -> Optional[dict[str, Any]]:
    """The lock's content from a descriptor this module opened (closed here), with `heartbeat` (its mtime),
    `lock_path` and `lock_id` (device, inode, link count: which file this very lock is) added from the file
    itself; None when it is not a regular file, too large or not a JSON object."""
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a device: no holder
            return None
        data = fh.read(MAX_LOCK_BYTES + 1)
    if len(data) > MAX_LOCK_BYTES:
        return None
    try:
        info = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(info, dict):
        return None
    info["heartbeat"] = st.st_mtime
    info["lock_path"] = str(path)
    info["lock_id"] = [st.st_dev, st.st_ino, st.st_nlink]
    info["lock_uid"] = st.st_uid
    return info


def read(run_dir: str | os.PathLike[str]) -> Optional[dict[str, Any]]:
    """The lock's content, or None when there is no (readable) lock: a lock that is not a JSON object, or a
    `run.lock` that is a symbolic link (read never through one: it would be another file's word), names no
    holder. `heartbeat` (the file's mtime), `lock_path` and `lock_id` are added from the file itself."""
    path = Path(run_dir) / LOCK_NAME
    try:
        return _read_open(files.open_beneath(run_dir, LOCK_NAME), path)
    except OSError:  # missing, a link (not followed), not a regular file
        return None


def _read_beneath(run_dir: str | os.PathLike[str] | int) -> Optional[dict[str, Any]]:
    """As `read`, with the run directory itself opened without following a link either (what a signal is
    sent on: a run directory that is a link to another run's names that run's holder), or read from the
    directory descriptor `run_dir` (one opened once, no link on its way: `launchers.cancel`), so that the lock
    read is the one of the directory judged, whatever its name leads to meanwhile."""
    if isinstance(run_dir, int):
        path = Path(f"/proc/self/fd/{run_dir}") / LOCK_NAME
        try:
            return _read_open(files.open_beneath(run_dir, LOCK_NAME), path)
        except OSError:
            return None
    path = Path(run_dir) / LOCK_NAME
    head, name = os.path.split(os.path.normpath(os.fspath(run_dir)))
    try:
        return _read_open(files.open_beneath(head or ".", os.path.join(name, LOCK_NAME)), path)
    except OSError:  # missing, a link on the way or as the lock (not followed), not a regular file
        return None


def _same_process(info: dict[str, Any]) -> Optional[int]:
    """The pid the lock names when that pid is alive on this host with the start time and the command line
    the lock records; None otherwise (a lock without them proves nothing)."""
    if info.get("host") != socket.gethostname():
        return None
    pid, started, cmd = fields.integer(info.get("pid")), info.get("pid_start"), info.get("cmdline")
    if pid is None or pid <= 0 or not isinstance(started, str) or not isinstance(cmd, list) or not cmd:
        return None
    if _start_time(pid) != started or _cmdline(pid) != cmd:
        return None
    return pid


def is_legacy(info: dict[str, Any]) -> bool:
    """Whether the lock was written by an rrtrain older than command lines and flock in locks: it records host,
    pid, start time, job and heartbeat only, and its holder keeps no flock on it."""
    return "cmdline" not in info and "flock" not in info


def legacy_holder(info: dict[str, Any]) -> Optional[int]:
    """For a lock an older rrtrain wrote (`is_legacy`), on this host: the pid it names when that pid is alive
    with the start time recorded, runs an rrtrain command (`runs_rrtrain`), and the lock's heartbeat (touched
    every `HEARTBEAT_S` by every rrtrain holder, old or new) is younger than `STALE_S`; else None. Enough to wait on, never to signal: such a
    lock cannot show that the process holds it."""
    if not is_legacy(info) or info.get("host") != socket.gethostname():
        return None
    pid, started = fields.integer(info.get("pid")), info.get("pid_start")
    if pid is None or pid <= 0 or not isinstance(started, str) or _start_time(pid) != started:
        return None
    if not runs_rrtrain(_cmdline(pid) or []):
        return None
    return pid if time.time() - (fields.finite(info.get("heartbeat")) or 0.0) < STALE_S else None


#: what the command line of a process that trains a run holds: `-m rrtrain.train` (torchrun's workers, the
#: local executor), the `rrtrain` command (`rrtrain train`, the debug executor), submitit's job entry
RRTRAIN_ENTRIES = frozenset({"rrtrain.train", "rrtrain", "submitit.core._submit"})


def runs_rrtrain(cmdline: list[str]) -> bool:
    """Whether a command line is one that trains an rrtrain run (`RRTRAIN_ENTRIES`, or the `rrtrain` script)."""
    return any(arg in RRTRAIN_ENTRIES or os.path.basename(arg) == "rrtrain" for arg in cmdline[:6])


def holder_alive(info: dict[str, Any]) -> bool:
    """Whether the lock's holder proves itself: on this host, the process it names is alive with the start time
    and command line recorded and holds the lock file's flock (where the kernel's lock table cannot be read, or
    the holder's filesystem refused flock, the first three suffice: waiting is the safe side); a lock an older
    rrtrain wrote, by pid, start time and a fresh heartbeat (`legacy_holder`); elsewhere, a fresh heartbeat."""
    if info.get("host") == socket.gethostname():
        if is_legacy(info):
            return legacy_holder(info) is not None
        pid = _same_process(info)
        if pid is None:
            return False
        path = info.get("lock_path")
        if info.get("flock") is False:  # its filesystem refused flock: identity is all there is to go on
            return True
        return isinstance(path, str) and _holds_flock(pid, path) is not False
    return time.time() - (fields.number(info.get("heartbeat")) or 0.0) < STALE_S


def _has_open(pid: int, dev: int, ino: int) -> bool:
    """Whether the process has the file (device, inode) open: one of its descriptors (/proc/PID/fd) is that
    very file. Device and inode are compared as stat(2) gives them on both sides."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for name in names:
        try:
            st = os.stat(os.path.join(fd_dir, name))
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (dev, ino):
            return True
    return False


def signallable_pid(run_dir: str | os.PathLike[str] | int) -> Optional[int]:
    """The pid of the live process on this host that provably holds the run's lock, else None: only such a
    process may be signalled. Proof: the lock file is read without following a link (neither `run.lock` nor
    the run directory may be one; `run_dir` may be a descriptor of the directory, opened once: then the lock
    is that very directory's, whatever its path names by now), it is this directory's own file (one link: no
    hard link to another run's lock) and this user's (a lock another user wrote proves nothing of this
    user's run), its pid is alive with the start time and command line recorded, that process has this very
    file open (device and inode) and holds its flock."""
    info = _read_beneath(run_dir)
    if info is None:
        return None
    dev, ino, links = info["lock_id"]
    if links != 1 or info.get("lock_uid") != os.geteuid():
        return None
    pid = _same_process(info)
    if pid is None or not _has_open(pid, dev, ino) or _holds_flock(pid, info["lock_path"], ino) is not True:
        return None
    return pid


def _not_a_lock_file(path: Path) -> Optional[str]:
    """What `path` is when it is there and no lock rrtrain could have written (a directory, a FIFO, a symbolic
    link, a device), in words; None when it is a regular file or gone."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    return own_files.kind(mode)


def _open_guard(path: Path) -> Any:
    """The take-over guard file, opened never through a link and only when it is a regular file (a FIFO would
    block the opener); UsageError otherwise, naming it."""
    try:
        return os.fdopen(files.open_lock_file(path), "r+b")
    except OSError as err:  # a link (ELOOP) or not a regular file (NotRegular)
        odd = _not_a_lock_file(path)
        if odd is None:
            raise
        raise UsageError(f"{path} is {odd}, not the guard file rrtrain makes: move it out of the run directory "
                         "and start the run again (it is left as it is)") from err


def _unreadable_since(path: Path) -> Optional[tuple[int, int, int, float]]:
    """Which lock file this is (inode, size, mtime in ns) and its mtime in seconds; None when it is gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_mtime


def describe(info: dict[str, Any]) -> str:
    job = f", job {info['job_id']}" if info.get("job_id") else ""
    try:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(fields.finite(info.get("started")) or 0))
    except (OverflowError, OSError, ValueError):  # a time no calendar has: the lock is not ours to trust anyway
        since = "an unreadable time"
    return f"host {info.get('host')} pid {info.get('pid')}{job}, since {since}"


class RunLock:
    """The lock on one run directory, held by this process until `release()`."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.nonce = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._fd: Optional[int] = None  # the lock file, open (and flock-ed) while held
        self.flocked = False

    def _content(self) -> bytes:
        pid = os.getpid()
        info = {"host": socket.gethostname(), "pid": pid, "pid_start": _start_time(pid), "cmdline": _cmdline(pid),
                "flock": self.flocked, "job_id": job_id(), "started": time.time(), "nonce": self.nonce}
        return (json.dumps(info) + "\n").encode()

    def _try_create(self) -> bool:
        """Create the lock with this process's content and keep it open and flock-ed (the proof that this
        process holds it); a lock file whose write failed is removed again."""
        try:
            fd = files.open_beneath(self.run_dir, LOCK_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                                     files.file_mode())
        except FileExistsError:
            return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody else can hold it
                self.flocked = True
            except OSError:  # a filesystem without flock (Lustre mounted without it): the lock says so
                self.flocked = False
            content = self._content()
            if os.write(fd, content) != len(content):
                raise OSError(f"short write to {self.path}")
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            files.remove_file(self.path)
            raise
        self._fd = fd
        return True

    def _take_over(self, seen: Optional[dict[str, Any]], seen_stat: Optional[tuple[int, int, int, float]], why: str) -> None:
        """Remove a lock whose holder is gone (`seen`) or that names none (`seen_stat`: unreadable), under a
        guard so two contenders cannot both remove one another's; says so on stderr."""
        with _open_guard(self.run_dir / f".{LOCK_NAME}.guard") as guard:
            flock_within(guard, f"{self.run_dir / f'.{LOCK_NAME}.guard'} (the lock's take-over guard)")
            now = read(self.run_dir)
            if seen is not None:
                gone = now is not None and now.get("nonce") == seen.get("nonce") and not holder_alive(now)
            else:
                gone = now is None and _unreadable_since(self.path) == seen_stat
            if gone:
                files.remove_file(self.path)  # the name only: unlink never follows a link
                print(f"rrtrain: taking over {self.path}: {why}", file=sys.stderr, flush=True)

    def acquire(self, wait_s: float) -> "RunLock":
        """Take the lock, waiting up to `wait_s` seconds for a live holder; raises RunLocked."""
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            if self._try_create():
                self._start_heartbeat()
                return self
            odd = _not_a_lock_file(self.path)
            if odd:
                raise UsageError(f"{self.path} is {odd}, not a lock file rrtrain wrote: move it out of the run "
                                 "directory and start the run again (it is left as it is)")
            info = read(self.run_dir)
            if info is not None and not holder_alive(info):
                old = (" (a lock of an older rrtrain: that pid is not alive with the recorded start time, or the "
                       "heartbeat stopped)") if is_legacy(info) else ""
                self._take_over(info, None, f"its holder ({describe(info)}) is not a live rrtrain process{old}")
                continue
            if info is None:
                seen = _unreadable_since(self.path)
                if seen is None:  # gone meanwhile: try again
                    continue
                age = time.time() - seen[3]
                if age >= STALE_S:
                    self._take_over(None, seen, f"it names no holder (empty or not a JSON object) and is "
                                                f"{age:.0f} s old (the stale limit is {STALE_S:g} s)")
                    continue
            if time.monotonic() >= deadline:
                who = describe(info) if info else "another process (its lock names no holder yet)"
                hint = ""
                if info is not None and is_legacy(info):
                    hint = (f"; the lock was written by an older rrtrain, which cannot prove more than that pid "
                            f"{info.get('pid')} is alive with its start time and the lock's heartbeat is fresh: if "
                            f"that process is not this run, stop it, or remove {self.path}")
                raise RunLocked(f"run directory {self.run_dir} is locked by {who}: another copy of this run is "
                                f"training there; waited {wait_s:g} s (run.lock_wait_s), leaving it alone{hint}")
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
            files.remove_file(self.path)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def hold(run_dir: Path, wait_s: float, is_main: bool, device: Any) -> Optional[RunLock]:
    """Rank 0 takes the lock; every rank learns the outcome, and all raise RunLocked together if it failed."""
    import torch

    from rrtrain.core import dist

    lock, error = None, None
    if is_main:
        try:
            lock = RunLock(run_dir).acquire(wait_s)
        except (RunLocked, OSError, UsageError) as err:  # raised below, once the others know
            error = err
    code = 2.0 if isinstance(error, UsageError) else 1.0 if error else 0.0
    failed = dist.all_reduce(torch.tensor([code], device=device), "max").item()
    if failed > 1:
        raise error or UsageError(f"run directory {run_dir}: rank 0 refused its {LOCK_NAME}")
    if failed > 0:
        raise error or RunLocked(f"run directory {run_dir}: rank 0 could not take its lock")
    return lock
