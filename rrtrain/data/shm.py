"""Streaming's shared memory on one machine: one of the user's processes at a time takes a name, a name another
program took first is searched for again, and only dead runs' names go.

MosaicML streaming keeps each dataset's state in /dev/shm segments named `NNNNNN_<kind>`, the prefix NNNNNN
being the first one free when the dataset was opened. What goes wrong on a machine that runs several
trainings at once (a sweep's parallel runs, a job array, a test suite):
- two datasets opened at the same moment take the same prefix (`FileExistsError: '/000064_locals'`):
  `shm_guard` serialises that per machine and user with a file lock;
- a run SIGKILLed mid-read leaks its segments, and a requeued successor with the same cache dir is refused.
  Streaming's own cleaner unlinks every segment from prefix 0 up to the first free one, live runs' included
  (their later workers and ranks cannot attach, and the next dataset may take their prefix), and stops at the
  first gap, so names above it leak for good. `unlink_stale` removes the segments of every prefix whose run
  is gone (`live_prefixes`), above gaps too, and nothing else;
- a run that exits unlinks its names while another run looks for a free prefix, and that run's ranks find
  different ones ("prefix=N was not registered by local leader"): `unlink_at_exit_under_lock` makes the exit
  take the same lock;
- multiprocessing's resource tracker outlives a process killed alone and unlinks that process's names without
  the lock and in no order: `untrack_streaming_names` keeps it away from streaming's names;
- other programs on the machine (another user's job, a script using streaming directly) take no lock of ours:
  a prefix one of them registers between our search and our registration is searched for again
  (`register_prefix`), not a crash.
Every dataset rrtrain opens goes through `open_streaming_dataset`, which does all of the above; the lock is
this user's (`rrtrain.core.host_locks`: another user can neither hold nor plant it) and is waited on for at most
`RRTRAIN_LOCK_WAIT_S`.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import os
import random
import re
import threading
import time
from typing import IO, Callable, Iterator, Optional

import torch

from rrtrain.core.errors import RunError, UsageError
from rrtrain.core.host_locks import LockTimeout, flock_within, lock_wait_s, open_private_lock, private_runtime_dir
from rrtrain.core.lazy_import import streaming_module
from rrtrain.core import files as rrfiles
from rrtrain.core.files import open_lock_file

#: the lock file, in this user's private runtime directory, under which one of this user's processes per
#: machine at a time makes or probes streaming's shared-memory names (see `shm_guard`)
LOCK_NAME = "streaming.lock"

#: a path that replaces the per-user lock (a test's own lock, so that it can hold the real one meanwhile)
SHM_LOCK: Optional[str] = None

#: how many times a search for a free prefix is repeated when another process registers the prefix found first
PREFIX_TRIES = 100

#: seconds an exiting process waits for the lock; past them it leaves its names to the next run's
#: `unlink_stale` (a wedged holder must not stop an exit, and unlinking unguarded races other runs' look-ups)
EXIT_LOCK_WAIT_S = 10.0

_shm_lock = threading.Lock()
_shm_cleaned = False
_untracked = False
_let_go = False
_registers = False
_exit_lock: Optional[IO[bytes]] = None


@functools.lru_cache(maxsize=None)
def streaming_names() -> re.Pattern[str]:
    """What streaming's shared-memory names look like: `NNNNNN_<kind>`, one kind per segment it makes."""
    constant = streaming_module("streaming.base.constant")
    return re.compile(r"\d{6}_(" + "|".join(map(re.escape, constant.SHM_TO_CLEAN)) + ")")


def untrack_streaming_names() -> None:
    """Keep multiprocessing's resource tracker away from streaming's names in this process (once).

    The tracker is a process of its own: when its parent is killed alone (a `kill -9` of the trainer, a kill
    that reaches the tracker last), it unlinks every name the parent made, without the machine's lock and in no
    order. A prefix can so lose its `_locals` and keep its `_barrier`; streaming takes the highest of its
    searches per kind for a free prefix, and that lands on a live run's (`FileExistsError: '/000102_locals'`).
    Untracked, a killed run's names stay whole until the next run's `unlink_stale` takes them under the lock;
    a run that ends still unlinks its own (streaming's exit handlers)."""
    global _untracked
    with _shm_lock:
        if _untracked:
            return
        from multiprocessing import resource_tracker

        def skipping_streaming(call: Callable[[str, str], None]) -> Callable[[str, str], None]:
            def tracked(name: str, rtype: str) -> None:
                if not (rtype == "shared_memory" and streaming_names().fullmatch(name.lstrip("/"))):
                    call(name, rtype)
            return tracked

        resource_tracker.register = skipping_streaming(resource_tracker.register)
        resource_tracker.unregister = skipping_streaming(resource_tracker.unregister)
        _untracked = True


def let_go_of_other_runs_names() -> None:
    """Make streaming's search for a free prefix in this process close what it opens as it goes (once).

    The search opens every segment below the first free prefix, other runs' included, through streaming's
    `SharedMemory`, which keeps each open one mapped until the process exits (an atexit hook closes it). A dead
    run's names that a live process so looked past look alive to every clean-up (`live_prefixes`), and the dead
    run's requeued successor is refused its cache dir for as long as that process lives; a run that died just
    after another process cleaned and before it searched (any process not holding the machine's lock meanwhile)
    leaks that way. Opened without the hook, a segment is closed as soon as the search drops it; what the
    dataset keeps (its own `_locals`, on ranks that are not the local leader) stays open while it is held, and
    what a process creates is still unlinked at its exit."""
    global _let_go
    with _shm_lock:
        if _let_go:
            return
        prefix = streaming_module("streaming.base.shared.prefix")
        opened_by_search = prefix.SharedMemory

        class ClosedWhenDropped(opened_by_search):  # type: ignore[misc,valid-type]
            def __init__(self, name: Optional[str] = None, create: Optional[bool] = None, size: int = 0,
                         auto_cleanup: bool = True) -> None:
                super().__init__(name, create, size, auto_cleanup=auto_cleanup and create is not False)

        prefix.SharedMemory = ClosedWhenDropped
        _let_go = True


#: the file locks streaming keeps beside its shared memory, one pair per prefix
FILE_LOCK_NAME = re.compile(r"\d{6}_(barrier|cache)_filelock")


def file_lock_dir() -> str:
    """Where this user's datasets keep streaming's file locks: `streaming/` in the user's private runtime
    directory (0700), not the temp directory every user writes to, where anyone could plant a lock file for the
    prefix a run is about to take (a file of theirs the run cannot open) or leave ones that make every search
    skip a prefix."""
    path = os.path.join(private_runtime_dir(), "streaming")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    return path


def register_prefix_safely() -> None:
    """Make every dataset this process opens register its prefix with `register_prefix` and keep its file
    locks in `file_lock_dir()` (once)."""
    global _registers
    with _shm_lock:
        if _registers:
            return
        dataset = streaming_module("streaming.base.dataset")
        prefix = streaming_module("streaming.base.shared.prefix")
        dataset.get_shm_prefix = register_prefix
        dataset.gettempdir = prefix.gettempdir = file_lock_dir
        _registers = True


def register_prefix(streams_local: list[str], streams_remote: list[Optional[str]], world,  # noqa: ANN001
                    retry: int = 100) -> tuple[int, object]:
    """Streaming's `get_shm_prefix`, safe against processes that do not take our lock.

    Streaming searches for the first free prefix on every rank, then the local leader creates its `_locals`
    and the other local ranks attach to the prefix they found. Another process (another user's job, a script
    using streaming directly) that creates the same `_locals` between the search and the creation makes the
    leader fail (`FileExistsError: '/000015_locals'`), and its ranks find different prefixes. Here only the
    leader searches, creates `_locals` exclusively and, when someone took the prefix first, searches again
    (`PREFIX_TRIES` times); then it tells its machine's other ranks the prefix (one all-reduce), and they
    attach and check it as streaming does. A leader's error is every rank's: no rank waits for a leader that
    gave up. The search and the checks are streaming's own."""
    prefix = streaming_module("streaming.base.shared.prefix")
    constant = streaming_module("streaming.base.constant")
    prefix._check_self(streams_local)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    found, shm, error = -1, None, None
    if world.is_local_leader:
        try:
            found, shm = _create_first_free(prefix, constant, streams_local, streams_remote, retry)
        except Exception as err:  # every rank must still reach the collective below
            error = err
    if distributed:
        slots = torch.zeros(world.num_nodes, dtype=torch.int64, device=_device())
        if world.is_local_leader:
            slots[world.node] = 1 if error is not None else found + 2
        torch.distributed.all_reduce(slots)
        code = int(slots[world.node].item())
        found = code - 2
    if error is not None:
        raise error
    if world.is_local_leader:
        return found, shm
    if found < 0:
        raise ValueError("this machine's first rank could not register a shared-memory prefix (see its error)")
    shm = prefix.SharedMemory(prefix._get_path(found, constant.LOCALS), False)
    their_locals, their_prefix = prefix._unpack_locals(bytes(shm.buf))
    if their_locals != streams_local or their_prefix != found:
        raise RuntimeError(f"shared memory prefix {found} registers {their_locals}, not this run's {streams_local}")
    return found, shm


def _create_first_free(prefix, constant, streams_local: list[str], streams_remote: list[Optional[str]],  # noqa: ANN001
                       retry: int) -> tuple[int, object]:
    """Find the first prefix free of every kind of name and create its `_locals` exclusively; search again
    when another process created it first."""
    rng = random.Random()
    for _ in range(PREFIX_TRIES):
        found = max(prefix._check_and_find_retrying(streams_local, streams_remote, shm_name=kind, retry=retry)
                    for kind in constant.SHM_TO_CLEAN)
        data = prefix._pack_locals(streams_local, found)
        try:
            shm = prefix.SharedMemory(prefix._get_path(found, constant.LOCALS), True, len(data))
        except FileExistsError:  # another process registered it since the search: look again
            time.sleep(rng.uniform(0, 0.01))
            continue
        shm.buf[:len(data)] = data
        return found, shm
    raise RunError(f"no free shared-memory prefix for streaming after {PREFIX_TRIES} searches: other processes "
                   "on this machine took each one first")


def open_streaming_dataset(local_rank: int = 0, **kwargs: object):  # noqa: ANN201 - a StreamingDataset
    """`StreamingDataset(**kwargs)`, opened the one way rrtrain opens a dataset: under this user's machine lock
    (`shm_guard`), after dead runs' names are cleaned (`clean_stale_shm`), with the prefix registered by
    `register_prefix`, and with this process's names unlinked under the lock at exit. Every rank of a run
    calls it together."""
    StreamingDataset = streaming_module("streaming.base.dataset").StreamingDataset
    register_prefix_safely()
    with shm_guard(local_rank):
        clean_stale_shm(local_rank)
        dataset = StreamingDataset(**kwargs)
        unlink_at_exit_under_lock()
    return dataset


def open_machine_lock() -> IO[bytes]:
    """This user's streaming lock on this machine (`SHM_LOCK` where a test set one)."""
    if SHM_LOCK is None:
        return open_private_lock(LOCK_NAME)
    try:
        return os.fdopen(open_lock_file(SHM_LOCK, 0o600), "r+b")
    except OSError as err:
        raise UsageError(f"{SHM_LOCK} cannot be the machine's streaming lock ({err.strerror or err}): remove it "
                         "(rrtrain makes it)") from None


def _lock_name() -> str:
    where = SHM_LOCK or os.path.join(private_runtime_dir(), LOCK_NAME)
    return f"the machine's streaming lock ({where})"


@contextlib.contextmanager
def shm_guard(local_rank: int = 0) -> Iterator[None]:
    """Serialise, per machine and user, what creates or probes streaming's shared-memory names.

    `StreamingDataset` registers the first free prefix: two runs starting together on one machine collide
    there. Each machine's local leader holds this user's lock for the whole look-up, which streaming spreads
    over collectives of every rank of the run; the other local ranks wait until every leader has its lock, so
    their look-ups run under it too. Every rank of a run must enter together (as streaming's own collectives
    require already). A lock still held after `RRTRAIN_LOCK_WAIT_S` is `LockTimeout`, on every rank."""
    leader = int(os.environ.get("LOCAL_RANK", local_rank)) == 0
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    untrack_streaming_names()
    let_go_of_other_runs_names()
    handle = open_machine_lock() if leader else None
    try:
        if distributed:
            _lock_on_every_machine(handle)
        elif handle is not None:
            flock_within(handle, _lock_name())
        yield
        if distributed:
            torch.distributed.barrier()
    finally:
        if handle is not None:
            handle.close()  # releases the lock


#: the longest pause between two rounds of `_lock_on_every_machine` (seconds; each pause is random up to it)
LOCK_RETRY_MAX_S = 0.5


def _lock_on_every_machine(handle: Optional[IO[bytes]]) -> None:
    """Return once every machine's leader of this run holds its machine's lock (`handle`: this rank's, None
    on a rank that is no leader). A leader must not block on its lock while it holds another: the holder of
    this machine's lock may be a run that spans a second machine too, waiting at its own barrier for its
    leader there, who waits for the lock this run holds on that machine (two multi-node jobs sharing nodes
    hung that way for good). So each round every leader only tries its lock, the run agrees on whether all
    got theirs (one all-reduce, which also makes the other ranks wait), and if one did not, the leaders let go
    and try again after a random pause: whichever run finds every lock free first goes on. The run gives up
    together once any rank's deadline has passed."""
    rng = random.Random()  # not the training's generators: a pause must differ between runs and between tries
    wait_s = lock_wait_s()
    deadline = time.monotonic() + wait_s
    torch.distributed.barrier()  # no leader holds its lock while it waits for a rank still on its way
    while True:
        held = handle is None
        if handle is not None:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except BlockingIOError:
                pass
        all_held, in_time = _everyone(held, time.monotonic() < deadline)
        if all_held:
            return
        if held and handle is not None:
            fcntl.flock(handle, fcntl.LOCK_UN)
        if not in_time:
            raise LockTimeout(f"the streaming lock of this run's machines is still held by another process "
                              f"after {wait_s:g} s (RRTRAIN_LOCK_WAIT_S); is a run of yours stuck there?")
        time.sleep(rng.uniform(0.02, LOCK_RETRY_MAX_S))


def _device() -> torch.device:
    """Where the default group's collectives run (its backend's device)."""
    backend = str(torch.distributed.get_backend())
    on_gpu = "gloo" not in backend and torch.cuda.is_available()
    return torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")


def _everyone(*values: bool) -> tuple[bool, ...]:
    """Whether each of `values` is true on every rank (one collective of the default group)."""
    flags = torch.tensor([int(v) for v in values], dtype=torch.int32, device=_device())
    torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MIN)
    return tuple(bool(v) for v in flags.tolist())


def _lock_before_streaming_exits() -> None:
    """atexit: take the machine's lock before streaming's exit handlers unlink this process's names, and keep
    it until they are done. Without the lock within EXIT_LOCK_WAIT_S (or without a usable lock file), leave the
    names: a dead run's names are the next run's `unlink_stale`'s to take, whole and under the lock."""
    global _exit_lock
    if _exit_lock is not None:
        return
    try:
        handle = open_machine_lock()
    except UsageError:
        _keep_streaming_names()
        return
    deadline = time.monotonic() + EXIT_LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                _keep_streaming_names()
                break
            time.sleep(0.02)
    _exit_lock = handle


def _keep_streaming_names() -> None:
    """From now on this process unlinks no streaming name (it is exiting; streaming's handlers come next)."""
    from multiprocessing import shared_memory

    unlink = shared_memory._posixshmem.shm_unlink  # type: ignore[attr-defined]

    def unlink_others(name: str) -> None:
        if not streaming_names().fullmatch(name.lstrip("/")):
            unlink(name)

    shared_memory._posixshmem.shm_unlink = unlink_others  # type: ignore[attr-defined]


def _release_after_streaming_exits() -> None:
    """atexit, registered before any dataset exists, so it runs after streaming's handlers."""
    global _exit_lock
    if _exit_lock is not None:
        _exit_lock.close()
        _exit_lock = None


atexit.register(_release_after_streaming_exits)


def unlink_at_exit_under_lock() -> None:
    """Call after opening a dataset: streaming registered its exit handlers (which unlink the names this
    process created); ours, registered after them, runs before them (atexit runs last-in first-out) and
    takes the lock, so no other run looks for a free prefix while they go."""
    atexit.unregister(_lock_before_streaming_exits)
    atexit.register(_lock_before_streaming_exits)


def in_use(shm_dir: str = "/dev/shm", proc: str = "/proc") -> set[str]:
    """Names in `shm_dir` that a live process maps or holds open, as far as `proc` lets us see (another
    user's processes may be hidden, but their segments are not ours to unlink either).

    Only the same file counts (device and inode): a process in another mount namespace (a container, a node of
    the local cluster) shows a segment of its own /dev/shm under the same path, which keeps nothing here alive."""
    files: dict[tuple[int, int], str] = {}
    for name in os.listdir(shm_dir):
        try:
            st = os.stat(os.path.join(shm_dir, name))
        except OSError:
            continue
        files[(st.st_dev, st.st_ino)] = name
    prefix = shm_dir.rstrip("/") + "/"
    names: set[str] = set()
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with rrfiles.open_regular(os.path.join(proc, pid, "maps")) as maps:
                for raw in rrfiles.lines(maps, 1 << 16):  # "address perms offset major:minor inode /dev/shm/NAME"
                    if raw is None:
                        continue
                    line = raw.decode("utf-8", "surrogateescape")
                    fields = line.split(None, 5)
                    if len(fields) == 6 and fields[5].startswith(prefix):
                        major, minor = (int(part, 16) for part in fields[3].split(":"))
                        name = files.get((os.makedev(major, minor), int(fields[4])))
                        if name is not None:
                            names.add(name)
            fd_dir = os.path.join(proc, pid, "fd")
            for fd in os.listdir(fd_dir):
                link = os.path.join(fd_dir, fd)
                if os.readlink(link).startswith(prefix):
                    st = os.stat(link)  # the open file itself
                    name = files.get((st.st_dev, st.st_ino))
                    if name is not None:
                        names.add(name)
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return names


def live_prefixes(names: list[str], used: set[str]) -> set[str]:
    """The streaming prefixes of `names` whose run is alive.

    A prefix lives while it has its `_locals` and a process maps one of its segments other than `_locals`
    (every reader maps every `_locals`), or its `_locals` when that is all it has. Streaming's search for a free
    prefix also opens every segment below the first free one and keeps it mapped until exit: a dead run's names
    that another live run looked past stay "alive" until that run exits. They are only skipped meanwhile, never
    taken. A prefix without `_locals` is dead however mapped: a run makes it first and unlinks it last, both
    under the lock this clean-up runs under; one left so would make streaming's search end on a live prefix."""
    by_prefix: dict[str, list[str]] = {}
    for name in names:
        by_prefix.setdefault(name[:6], []).append(name)
    live = set()
    for prefix, own in by_prefix.items():
        if f"{prefix}_locals" not in own:
            continue
        others = [n for n in own if not n.endswith("_locals")]
        if any(n in used for n in (others or own)):
            live.add(prefix)
    return live


def unlink_stale(shm_dir: str = "/dev/shm", proc: str = "/proc", lock_dir: Optional[str] = None) -> int:
    """Unlink every streaming shared-memory name in `shm_dir` whose run is no longer alive; returns how many.
    With `lock_dir` (this user's `file_lock_dir()`, for the machine's real /dev/shm only), also remove the file
    locks there of every prefix that is not alive: streaming leaves them behind, and its search skips a prefix
    whose file lock exists.

    Call it where a dataset is opened: on the local leader, under `shm_guard` (no other rrtrain process takes
    a name meanwhile; a run creates its `_locals` before its file locks, both under the lock)."""
    try:
        names = [n for n in os.listdir(shm_dir) if streaming_names().fullmatch(n)]
    except OSError:
        return 0
    live = live_prefixes(names, in_use(shm_dir, proc)) if names else set()
    stale = [os.path.join(shm_dir, n) for n in names if n[:6] not in live]
    if lock_dir is not None:
        with contextlib.suppress(OSError):
            stale += [os.path.join(lock_dir, n) for n in os.listdir(lock_dir)
                      if FILE_LOCK_NAME.fullmatch(n) and n[:6] not in live]
    removed = 0
    for path in stale:
        try:
            rrfiles.remove_file(path, missing_ok=False)
            removed += 1
        except OSError:
            pass  # gone meanwhile, or not ours to remove
    return removed


def clean_stale_shm(local_rank: int = 0) -> None:
    """Remove shared memory leaked by dead streaming runs, before every dataset this process opens; every rank
    calls it (inside `shm_guard`, whose barrier makes the other local ranks wait for the leader), and no rank
    returns before the leader is done.

    Before every one, not once per process: streaming's search for a free prefix maps every segment it looks
    past until the process exits, so a dead run's names that a later open in a long-lived process searched
    past would look alive to every clean-up after it, and the dead run's requeued successor would be refused
    its cache dir for as long as that process lives.

    Where there is no /dev/shm (not Linux), streaming's own cleaner is all there is, once per process (it
    unlinks live runs' names too, this process's own included): it unlinks on local rank 0 (streaming reads
    $LOCAL_RANK; launchers that do not set it get ours) and waits at a barrier."""
    global _shm_cleaned
    with _shm_lock:
        leader = int(os.environ.get("LOCAL_RANK", local_rank)) == 0
        if os.path.isdir("/dev/shm") and os.path.isdir("/proc"):
            if leader:
                unlink_stale(lock_dir=file_lock_dir())
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                # every rank looks for the first free prefix on its own: one that looked while the leader was
                # still unlinking saw a later prefix than the leader registered, and could not find it
                torch.distributed.barrier()
        elif not _shm_cleaned:
            had_env = "LOCAL_RANK" in os.environ
            if not had_env:
                os.environ["LOCAL_RANK"] = str(local_rank)
            try:
                streaming_module("streaming.base.util").clean_stale_shared_memory()
            finally:
                if not had_env:
                    del os.environ["LOCAL_RANK"]
            _shm_cleaned = True
