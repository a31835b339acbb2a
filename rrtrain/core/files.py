"""The one file-access layer: every path rrtrain did not create in this process (a run, sweep or dataset
directory, a config, a lock, a log, a report, an event file) is opened, read, written, appended to or deleted
here, so that what a hostile or broken file can do is decided in one place.

What it guarantees:
- *No link on the way.* `open_beneath(root, rel)` walks `rel` one component at a time from `root`, each
  directory opened with `O_NOFOLLOW | O_DIRECTORY` relative to its parent's descriptor and the last component
  with `O_NOFOLLOW`: a symbolic link anywhere below `root`, a `..` or an absolute component is `LinkRefused` /
  `BadPath` (OSError). `root` itself is named by the caller (a command-line argument) and is taken as given.
  The path-based helpers (`open_regular`, `read_bytes`, `open_append`) are `open_beneath(dirname, basename)`:
  the file itself is never a link; `open_named` / `read_named` follow links, for a file the user named.
- *Regular files only*, opened non-blocking and checked with fstat: a FIFO never hangs a reader or a writer,
  a device never feeds one.
- *Bounded reads*: a whole-file read stops at the bound of its kind of file (`LIMITS`); `lines` stops a line at
  a length bound and reads the rest of an overlong one through in bounded pieces, never holding it whole.
- *Writes and appends* go only to files opened that way: `atomic_write_beneath` writes aside in the parent's
  descriptor and renames with `os.replace(..., src_dir_fd=, dst_dir_fd=)`; `open_append` appends with
  `O_APPEND | O_NOFOLLOW` to a regular file.
- *Private by construction*: every directory the layer makes is 0700 and every file 0600 (0750 / 0640 under
  RRTRAIN_GROUP_READ=1: the group may read, never write), set exactly whatever the umask; `private_umask`
  holds a command's own umask to the same for what libraries write; `check_private_path` refuses a place that
  someone other than the user (or root) can write, on the way to it included (OpenSSH's StrictModes).
- *Deletes only of what this invocation can prove it made*: `make_dir` / `mark_made` leave a marker file, an
  HMAC under this process's random key (or a directory's durable key, `directory_key`) of the directory's
  absolute place and its device and inode; `remove_made_dir` removes a directory only when that marker is a
  regular file that proves it, so a copied marker, a renamed directory and another process's marker prove
  nothing, and never one that holds an input of the same command.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import hmac
import os
import secrets
import shutil
import stat
import tempfile
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Optional, TextIO, Union

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC

#: the largest JSON or YAML file read whole when no kind says less (sweep.json of a thousand runs is a few MB)
MAX_BYTES = 256 * 1024 * 1024

#: kind of file -> the most bytes a whole-file read takes (each a few times what rrtrain ever writes there)
LIMITS: dict[str, int] = {
    "record": MAX_BYTES,  # sweep.json and other records read whole
    "json": 16 * 1024 * 1024,  # a run's own JSON files (final.json, pause.json, cancelled.json, eval results)
    "config": 16 * 1024 * 1024,  # a YAML config (a mistaken path to a dataset or a device is refused)
    "manifest": 16 * 1024 * 1024,  # a dataset's manifest.json (a few kB)
    "index": 64 * 1024 * 1024,  # a split's index.json
    "tokenizer": 256 * 1024 * 1024,  # a saved tokenizer.json
    "train_state": 16 * 1024 * 1024,  # a checkpoint's train_state.json
    "rank": 1024 * 1024,  # ranks/rankN.json
    "lock": 64 * 1024,  # run.lock
    "report": 16 * 1024 * 1024,  # a report's Markdown or a log shown to the user
    "proc": 16 * 1024 * 1024,  # a file of /proc (a process's stat or command line, the kernel's lock table)
}
#: the longest line `lines` hands over (a metrics line of a deep model is a few kB)
MAX_LINE_BYTES = 16 * 1024 * 1024

#: the file `make_dir` leaves in a directory it makes; its content is an HMAC of the directory's place (its
#: absolute path) and identity (device, inode) under a key only its maker holds
MARKER = ".rrtrain-made"
_TAG = "rrtrain-made-dir-v2"
#: this process's own key: a marker made with it proves "made by this very invocation" and nothing more (a
#: marker of a dead process, of another user or of another command is not honoured: see `made_here`)
_PROCESS_KEY = os.urandom(32)
#: the file that holds a directory's durable key (`directory_key`): 32 random bytes, 0600, the user's own
KEY_FILE = ".rrtrain-key"
_KEY_BYTES = 32

#: the one setting that widens what rrtrain writes: RRTRAIN_GROUP_READ=1 gives the group read (never write)
#: access. An environment variable, because every command (prep, sweep, train, export, the ranks torchrun and
#: Slurm start, a sweep's runs) inherits it unchanged, where a config key would reach only `rrtrain train`.
GROUP_READ_ENV = "RRTRAIN_GROUP_READ"


class NotRegular(OSError):
    """The path is there but is not a regular file (a FIFO, a device, a directory, a link)."""


class LinkRefused(OSError):
    """A symbolic link where the layer follows none (errno ELOOP)."""


class BadPath(OSError):
    """A relative path that would leave its root: `..`, an absolute component, or nothing at all."""


class TooLarge(OSError):
    """A file larger than the bound of its kind (errno EFBIG)."""


class NotMade(OSError):
    """A directory `remove_made_dir` refuses to delete: rrtrain did not make it, or it holds an input."""


# -- private by construction --------------------------------------------------------------------------


def group_read() -> bool:
    """Whether RRTRAIN_GROUP_READ=1 asks for the group to read what rrtrain writes (unset or 0: only the
    user); any other value is refused in one line rather than guessed."""
    value = os.environ.get(GROUP_READ_ENV, "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    from rrtrain.core.errors import UsageError

    raise UsageError(f"{GROUP_READ_ENV}={value[:40]!r}: set it to 1 (your group may read what rrtrain writes, "
                     "never write) or 0 / leave it unset (only you)")


def dir_mode() -> int:
    """The mode of every directory rrtrain makes: 0700, or 0750 under RRTRAIN_GROUP_READ=1."""
    return 0o750 if group_read() else 0o700


def file_mode() -> int:
    """The mode of every file rrtrain makes: 0600, or 0640 under RRTRAIN_GROUP_READ=1."""
    return 0o640 if group_read() else 0o600


def private_mask() -> int:
    """The umask under which what a library writes itself (torch, safetensors, TensorBoard) gets those modes."""
    return 0o027 if group_read() else 0o077


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Run a command under `private_mask` whatever the user's umask (a shared project's 002 would make its
    outputs group-writable), and give the old umask back after: the process-wide half of "private by
    construction", for files that libraries create with their own open(2); the layer sets exact modes itself."""
    old = os.umask(private_mask())
    try:
        yield
    finally:
        os.umask(old)


@contextlib.contextmanager
def working_in(path: str | os.PathLike[str]) -> Iterator[None]:
    """`path` as the working directory meanwhile, for a library that reads a settings file from the working
    directory whatever it is told (W&B's `wandb/settings`, matplotlib's `matplotlibrc`), where a co-tenant of a
    shared directory could plant one. The directory left is returned to through a descriptor held meanwhile, so
    it is the same directory even if it was renamed."""
    before = os.open(".", os.O_PATH | os.O_DIRECTORY)
    try:
        os.chdir(path)
        try:
            yield
        finally:
            os.fchdir(before)
    finally:
        os.close(before)


def chmod_here(path: str | os.PathLike[str], mode: int) -> None:
    """chmod `path` itself, never what a link at its name leads to (a link is left as it is: glibc's fchmodat
    refuses to change one, which Python reports as NotImplementedError)."""
    with contextlib.suppress(NotImplementedError):
        os.chmod(path, mode, follow_symlinks=False)


def make_dirs(path: str | os.PathLike[str]) -> str:
    """`os.makedirs(path, exist_ok=True)`, each directory it creates given `dir_mode()` exactly (whatever the
    umask); the ones already there are left as they are. Returns the path."""
    path = os.fspath(path)
    head, name = os.path.split(path)
    if not name:  # "a/b/" names the same directory as "a/b"
        head, name = os.path.split(head)
    if head and name and not os.path.exists(head):
        make_dirs(head)
    if not name or name in (".", ".."):
        return path
    mode = dir_mode()
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        return path
    chmod_here(path, mode)
    return path


def set_private_modes(top: str | os.PathLike[str]) -> None:
    """Give the tree under `top` (made by this command: a staged export or dataset) `dir_mode()` and
    `file_mode()` (a file with an execute bit keeps it for its owner, and the group's read), never following
    a link: what a library wrote in it with its own modes is the user's alone before it is published."""
    dmode, fmode = dir_mode(), file_mode()
    root_fd = os.open(top, _DIR)
    try:
        os.fchmod(root_fd, dmode)
    finally:
        os.close(root_fd)
    for dirpath, dirnames, filenames in os.walk(top):  # os.walk does not descend into links
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                chmod_here(path, dmode)
            elif stat.S_ISREG(st.st_mode):
                executable = bool(st.st_mode & stat.S_IXUSR)
                chmod_here(path, fmode | ((fmode & 0o440) >> 2) if executable else fmode)  # r -> r+x


def private_path_problem(path: str | os.PathLike[str]) -> Optional[str]:
    """Why someone other than the user (or root) could change what is at `path` (None: no one can), checked as
    OpenSSH's StrictModes does: every existing component of the path, as given and as resolved, owned by the
    user or root and writable by no one else; a sticky directory (/tmp) is fine above a component of the
    user's own. A link is judged by the directory holding it and by where it leads. The components still to
    be made are the caller's to make (`prepare_private_dir`)."""
    uid = os.geteuid()
    given = os.path.abspath(path)
    for candidate in dict.fromkeys([given, os.path.realpath(given)]):
        why = _chain_problem(candidate, uid)
        if why is not None:
            return why
    return None


def _chain_problem(absolute: str, uid: int) -> Optional[str]:
    parts = [p for p in absolute.split(os.sep) if p]
    chain = [os.sep] + [os.sep + os.path.join(*parts[: i + 1]) for i in range(len(parts))]
    found: list[tuple[str, os.stat_result]] = []
    for place in chain:
        try:
            found.append((place, os.lstat(place)))
        except FileNotFoundError:
            break  # still to be made
        except NotADirectoryError:  # a file (or a link to one) where a directory belongs: nothing can go there
            return f"'{found[-1][0]}' {NOT_A_DIRECTORY}"
        except OSError as err:
            return f"'{place}' cannot be checked ({err.strerror or type(err).__name__})"
    for i, (place, st) in enumerate(found):
        if st.st_uid not in (uid, 0):
            return f"'{place}' belongs to another user (uid {st.st_uid})"
        if stat.S_ISLNK(st.st_mode):
            continue  # its mode means nothing; where it leads is the resolved path's to check
        if st.st_mode & 0o022:
            if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and i + 1 < len(chain):
                continue  # sticky (/tmp): only the owner of the next component (checked next) may replace it
            who = "its group and others" if st.st_mode & 0o022 == 0o022 else \
                ("its group" if st.st_mode & 0o020 else "others")
            return f"'{place}' can be written by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


#: how `private_path_problem` ends when a component on the way is a file: no rule of privacy, a wrong path
NOT_A_DIRECTORY = "is not a directory (a file is in the way: choose another path)"

#: the rule `check_private_path` enforces, as its refusals end
PRIVATE_RULE = ("rrtrain runs code from, resumes from and writes into only directories no one else can write "
                "(chmod g-w,o-w the directory, or choose another)")


def explained(why: str) -> str:
    """`private_path_problem`'s answer as a refusal ends: with PRIVATE_RULE, unless it is a file in the way (a wrong
    path, which the rule would only confuse)."""
    return why if why.endswith(NOT_A_DIRECTORY) else f"{why}: {PRIVATE_RULE}"


def private_path_refusal(path: str | os.PathLike[str], what: str = "") -> Optional[str]:
    """`check_private_path`'s one line (None: `path` is private), for a caller that raises it on every rank."""
    why = private_path_problem(path)
    if why is None:
        return None
    return f"{what or os.fspath(path)}: {explained(why)}"


def check_private_path(path: str | os.PathLike[str], what: str = "") -> None:
    """UsageError, one line, when someone other than the user (or root) could write `path` or a directory on
    its way (`private_path_problem`): rrtrain runs no code from, resumes nothing in and writes nothing into
    such a place."""
    refusal = private_path_refusal(path, what)
    if refusal is not None:
        from rrtrain.core.errors import UsageError

        raise UsageError(refusal)


def prepare_private_dir(path: str | os.PathLike[str]) -> Optional[str]:
    """Make the directory `path` (its missing parents too, each `dir_mode()`), then say why it is not private
    (`private_path_problem`, checked before and after the making, so a directory someone slipped in meanwhile
    is caught); None: it is there and the user's alone."""
    why = private_path_problem(path)
    if why is not None:
        return why
    try:
        make_dirs(path)
    except OSError as err:
        return f"cannot make it ({err.strerror or type(err).__name__})"
    return private_path_problem(path)


Limit = Union[str, int]


def limit_of(limit: Limit) -> int:
    """The byte bound of a kind of file (a `LIMITS` key), or `limit` itself when it is a number."""
    if isinstance(limit, str):
        return LIMITS[limit]
    return int(limit)


# -- opening ------------------------------------------------------------------------------------------


def _parts(rel: str | os.PathLike[str]) -> list[str]:
    text = os.fspath(rel)
    if os.path.isabs(text):
        raise BadPath(errno.EINVAL, "an absolute path where a path inside the directory belongs", text)
    parts = [p for p in text.split(os.sep) if p not in ("", ".")]
    if ".." in parts:
        raise BadPath(errno.EINVAL, "'..' leads out of the directory", text)
    if not parts:
        raise BadPath(errno.EINVAL, "names no file inside the directory", text)
    return parts


def _refusal(err: OSError, dfd: int, name: str, where: str, last: bool) -> OSError:
    """`err` of opening `name` at `dfd` in words: a link is LinkRefused, whatever errno the kernel chose."""
    if err.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                words = "not a regular file" if last else f"a symbolic link on the way ({name}, not followed)"
                return LinkRefused(errno.ELOOP, words, where)
    if err.errno == errno.ENXIO and last:  # a FIFO opened for writing with no reader (non-blocking)
        with contextlib.suppress(OSError):
            if not stat.S_ISREG(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                return NotRegular(errno.ENXIO, "not a regular file", where)
    err.filename = where
    return err


def open_root(root: str | os.PathLike[str]) -> int:
    """A descriptor of the directory `root` (named by the caller: taken as given, links included)."""
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)


def _walk(root: Union[int, str, os.PathLike[str]], parts: list[str], where: str,
          make: bool = False) -> int:
    """A new descriptor of the directory holding the last of `parts`, each directory on the way opened without
    following a link (created first when `make`)."""
    dfd = os.dup(root) if isinstance(root, int) else open_root(root)
    try:
        for name in parts[:-1]:
            made = False
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, dir_mode(), dir_fd=dfd)
                    made = True
            try:
                nfd = os.open(name, _DIR, dir_fd=dfd)
            except OSError as err:
                raise _refusal(err, dfd, name, where, last=False) from None
            if made:
                os.fchmod(nfd, dir_mode())  # exactly, whatever the umask
            os.close(dfd)
            dfd = nfd
        return dfd
    except BaseException:
        os.close(dfd)
        raise


def open_beneath(root: Union[int, str, os.PathLike[str]], rel: str | os.PathLike[str], flags: int = os.O_RDONLY,
                 mode: int = 0o666, directory: bool = False, make_parents: bool = False) -> int:
    """A descriptor of `root/rel`, no link followed below `root` (see the module docstring), non-blocking while
    opening and checked to be a regular file (a directory with `directory`); blocking again once checked.
    `root` is a path or a directory descriptor. OSError subclasses: LinkRefused, BadPath, NotRegular, and
    the kernel's own (FileNotFoundError, PermissionError, ...)."""
    parts = _parts(rel)
    where = os.path.join(os.fspath(root), *parts) if not isinstance(root, int) else os.path.join(*parts)
    dfd = _walk(root, parts, where, make=make_parents)
    try:
        last = flags | os.O_NOFOLLOW | _CLOEXEC | (os.O_DIRECTORY if directory else os.O_NONBLOCK)
        try:
            fd = os.open(parts[-1], last, mode, dir_fd=dfd)
        except OSError as err:
            raise _refusal(err, dfd, parts[-1], where, last=True) from None
    finally:
        os.close(dfd)
    try:
        st_mode = os.fstat(fd).st_mode
        if directory and not stat.S_ISDIR(st_mode):
            raise NotRegular(errno.ENOTDIR, "not a directory", where)
        if not directory:
            if not stat.S_ISREG(st_mode):
                raise NotRegular(0, "not a regular file", where)
            os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_dir(path: str | os.PathLike[str]) -> int:
    """A descriptor of the directory `path`, never through a link as its last component (LinkRefused when it is
    one): a directory an output is written into, held so that a later swap of its name redirects nothing."""
    head, name = _split(path)
    return open_beneath(head, name, directory=True)


def _split(path: str | os.PathLike[str]) -> tuple[str, str]:
    """(directory, name) of `path`; a path ending in `.`, `..` or a separator names its directory absolutely
    (getcwd's path has no links), so that `--out .` is a directory like any other."""
    head, name = os.path.split(os.fspath(path))
    if name in ("", ".", ".."):
        head, name = os.path.split(os.path.abspath(path))
    return head or ".", name


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened for binary reading: its directory as given, the file itself never a link and only a
    regular file (FileNotFoundError when missing, NotRegular / LinkRefused otherwise)."""
    head, name = _split(path)
    return os.fdopen(open_beneath(head, name), "rb")


def open_named(path: str | os.PathLike[str]) -> BinaryIO:
    """A file the user named (a config or a corpus on the command line), opened for binary reading with links
    followed (the user chose them), only when it is a regular file, non-blocking while opening."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(0, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_lock_file(path: str | os.PathLike[str], mode: Optional[int] = None) -> int:
    """A lock file's descriptor, opened read-write and created when missing (`file_mode()` unless `mode`
    says otherwise), never through a symbolic link (OSError ELOOP: a planted link would make the opener create
    a file elsewhere) and only when it is a regular file (NotRegular: a FIFO would block the opener). flock(2)
    works on it as on any descriptor."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC,
                 file_mode() if mode is None else mode)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegular(0, "not a regular file", os.fspath(path))
    return fd


# -- reading ------------------------------------------------------------------------------------------


def _read_bounded(fh: BinaryIO, limit: Limit, where: str) -> bytes:
    bound = limit_of(limit)
    with fh:
        data = fh.read(bound + 1)
    if len(data) > bound:
        raise TooLarge(errno.EFBIG, f"larger than {bound} bytes", where)
    return data


def read_beneath(root: Union[int, str, os.PathLike[str]], rel: str | os.PathLike[str],
                 limit: Limit = "record") -> bytes:
    """The whole of `root/rel` (opened as `open_beneath` does), at most the bound of its kind."""
    return _read_bounded(os.fdopen(open_beneath(root, rel), "rb"), limit, os.fspath(rel))


def read_bytes(path: str | os.PathLike[str], limit: Limit = "record") -> bytes:
    """The whole of a regular file (as `open_regular` opens it) of at most `limit` bytes or the bound of the
    kind `limit` names; OSError (NotRegular, LinkRefused, FileNotFoundError, TooLarge) otherwise."""
    return _read_bounded(open_regular(path), limit, os.fspath(path))


def read_named(path: str | os.PathLike[str], limit: Limit = "config") -> bytes:
    """As `read_bytes`, for a file the user named (links followed: `open_named`)."""
    return _read_bounded(open_named(path), limit, os.fspath(path))


def read_text(path: str | os.PathLike[str], limit: Limit = "report") -> str:
    """`read_bytes` decoded as UTF-8 (undecodable bytes replaced: text shown to a person)."""
    return read_bytes(path, limit).decode("utf-8", errors="replace")


def tail_text(path: str | os.PathLike[str], max_bytes: int = 64 * 1024) -> str:
    """The last `max_bytes` of a regular file (as `open_regular` opens it) as text, its first line dropped when
    cut: the end of a log of any size, shown to a person."""
    with open_regular(path) as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - max_bytes))
        data = fh.read(max_bytes)
    if size > max_bytes:
        data = data.split(b"\n", 1)[1] if b"\n" in data else b""
    return data.decode("utf-8", errors="replace")


def lines(fh: BinaryIO, limit: int = MAX_LINE_BYTES) -> Iterator[Optional[bytes]]:
    """The lines of `fh` (newline kept), each at most `limit` bytes; a longer one is read through to its
    newline in 1 MiB pieces, never held whole, and stands as None."""
    while raw := fh.readline(limit + 1):
        if len(raw) > limit and not raw.endswith(b"\n"):
            _skip_line(fh)
            yield None
            continue
        yield None if len(raw) > limit else raw


def _skip_line(fh: BinaryIO) -> None:
    """Move past the rest of the current line (through its newline, or to the end), 1 MiB at a time."""
    while chunk := fh.read(1 << 20):
        cut = chunk.find(b"\n")
        if cut >= 0:
            fh.seek(cut + 1 - len(chunk), os.SEEK_CUR)
            return


# -- writing ------------------------------------------------------------------------------------------


def umask() -> int:
    """This process's umask, read from /proc where it says it (setting it to read it back races other threads)."""
    with contextlib.suppress(OSError, ValueError):
        for line in read_bytes("/proc/self/status", 1 << 20).decode("ascii", "replace").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_writer(root: Union[int, str, os.PathLike[str]], rel: str | os.PathLike[str],
                  make_parents: bool = True, mode: Optional[int] = None) -> Iterator[BinaryIO]:
    """A binary file to write `root/rel` through, atomically: a hidden file created (O_EXCL, no link followed)
    in the parent's descriptor, flushed and renamed over the name relative to that same descriptor when the
    block succeeds, removed when it fails. Neither a link on the way nor one planted at the name redirects the
    write (a link at the name is replaced, never written through). Missing directories on the way are made
    when `make_parents` (`dir_mode()`). The file is created with `mode` (default: `file_mode()`), exactly,
    whatever the umask, so a private file is never readable by others, not even for a moment. For a large
    file written as it streams;
    `atomic_write_beneath` for bytes in hand."""
    parts = _parts(rel)
    where = os.path.join(os.fspath(root), *parts) if not isinstance(root, int) else os.path.join(*parts)
    dfd = _walk(root, parts, where, make=make_parents)
    name = parts[-1]
    tmp = f".{name}.{secrets.token_hex(4)}.tmp{os.path.splitext(name)[1]}"
    try:
        mode = file_mode() if mode is None else mode
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, mode, dir_fd=dfd)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as out:
                yield out
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)


def atomic_write_beneath(root: Union[int, str, os.PathLike[str]], rel: str | os.PathLike[str], data: bytes,
                         make_parents: bool = True, mode: Optional[int] = None) -> None:
    """Write `data` to `root/rel` atomically (`atomic_writer`)."""
    with atomic_writer(root, rel, make_parents, mode) as out:
        out.write(data)


def atomic_write_file(path: str | os.PathLike[str], data: bytes | str, mode: Optional[int] = None) -> None:
    """`atomic_write_beneath(dirname, basename, data)`: the directory as given (made when missing, `make_dirs`),
    the name replaced, never written through; text is written as UTF-8."""
    head, name = _split(path)
    make_dirs(head)
    atomic_write_beneath(head, name, data.encode("utf-8") if isinstance(data, str) else data, mode=mode)


def open_append(path: str | os.PathLike[str], text: bool = True) -> Union[TextIO, BinaryIO]:
    """`path` opened for appending (created when missing, `file_mode()`): the directory as given, the file itself
    never a link (LinkRefused) and only a regular file (NotRegular: a FIFO would block the writer)."""
    head, name = _split(path)
    fd = open_beneath(head, name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, file_mode())
    return os.fdopen(fd, "a" if text else "ab")


def link_atomically(link: str | os.PathLike[str], target: str) -> None:
    """Make `link` a symbolic link to `target`, in one rename: a link made under a fresh hidden name beside it
    and renamed over it, so a reader sees the old link or the new one and whatever `link` was (a file, a link
    elsewhere) is replaced as a name, never written through."""
    head, name = _split(link)
    tmp = os.path.join(head, f".{name}.{secrets.token_hex(4)}.tmp")
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- directories rrtrain made, and only those deleted -------------------------------------------------


def _place(path: str | os.PathLike[str]) -> str:
    """The absolute place of `path` that a marker is bound to: its directory resolved (the links the user made
    on the way), its own name as it is (a rename changes it)."""
    head, name = _split(os.path.abspath(path))
    return os.path.join(os.path.realpath(head), name)


def _marker_line(place: str, st: os.stat_result, key: Optional[bytes]) -> str:
    """The marker's line for one place: an HMAC of the place and the directory's device and inode."""
    message = f"{place}\0{st.st_dev}\0{st.st_ino}".encode("utf-8", "surrogateescape")
    return f"{_TAG} {hmac.new(key or _PROCESS_KEY, message, hashlib.sha256).hexdigest()}\n"


#: the most places one marker names (a staging directory and where it is renamed to)
_MARKER_PLACES = 4


def directory_key(directory: str | os.PathLike[str]) -> bytes:
    """The durable key of `directory` (a run's checkpoints): 32 random bytes in its KEY_FILE, made once (0600,
    written aside and linked into place, so two makers agree on one) and read back only when it is a regular
    file of the user's that no one else can read. It lets a later invocation prove what an earlier one made
    there: a marker made with it names its place, so it proves nothing once copied or renamed, and no one who
    cannot read the key can make one. UsageError (one line) for a key file that is not private."""
    dfd = open_root(directory)
    try:
        try:
            fd = open_beneath(dfd, KEY_FILE)
        except FileNotFoundError:
            tmp = f".{KEY_FILE}.{secrets.token_hex(4)}.tmp"
            wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dfd)
            try:
                with os.fdopen(wfd, "wb") as out:
                    os.fchmod(wfd, 0o600)
                    out.write(os.urandom(_KEY_BYTES))
                    out.flush()
                    os.fsync(wfd)
                with contextlib.suppress(FileExistsError):  # another maker was first: its key is the one
                    os.link(tmp, KEY_FILE, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            finally:
                os.unlink(tmp, dir_fd=dfd)
            fd = open_beneath(dfd, KEY_FILE)
        try:
            st = os.fstat(fd)
            key = os.read(fd, _KEY_BYTES + 1)
        finally:
            os.close(fd)
    except LinkRefused as err:
        from rrtrain.core.errors import UsageError

        raise UsageError(f"{os.path.join(os.fspath(directory), KEY_FILE)}: {err.strerror}; move it away") from None
    finally:
        os.close(dfd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077 or len(key) != _KEY_BYTES:
        from rrtrain.core.errors import UsageError

        raise UsageError(f"{os.path.join(os.fspath(directory), KEY_FILE)} is not a key of yours that only you can "
                         f"read (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}, {len(key)} bytes): "
                         "move it away (the directories made under the old key are then kept, not deleted)")
    return key


def mark_made(path: str | os.PathLike[str], key: Optional[bytes] = None,
              places: Optional[Iterable[str | os.PathLike[str]]] = None) -> None:
    """Leave the marker in the directory `path` (this invocation made it): a line per place it may be proven
    at (`places`, default `path` itself; a directory about to be renamed names where to), each an HMAC under
    `key` (None: this
    process's own key) of that absolute place and the directory's device and inode. A copied marker names
    another inode, a renamed directory another place, and no one without the key can make a line. The lines
    already there are kept (the marker is left untouched when it holds them all: a checkpoint's files are
    hashed before it is renamed)."""
    dfd = os.open(path, _DIR)
    try:
        st = os.fstat(dfd)
        at = [os.fspath(path)] if places is None else [os.fspath(p) for p in places]
        want = [_marker_line(_place(p), st, key) for p in dict.fromkeys(at)]
        have: list[str] = []
        with contextlib.suppress(OSError):
            have = read_beneath(dfd, MARKER, 4096).decode("ascii", "replace").splitlines(keepends=True)
        if all(line in have for line in want):
            return
        lines = [line for line in have if line not in want][: max(0, _MARKER_PLACES - len(want))] + want
        atomic_write_beneath(dfd, MARKER, "".join(lines).encode("ascii"), make_parents=False)
    finally:
        os.close(dfd)


def make_dir(path: str | os.PathLike[str], exist_ok: bool = False, key: Optional[bytes] = None,
             places: Iterable[str | os.PathLike[str]] = ()) -> str:
    """Make the directory `path` (`dir_mode()`, its parents as needed) and mark it as made by this invocation
    (`mark_made` with `key`, for `path` and `places`), so that `remove_made_dir` may delete it later. Returns
    the path. A new directory
    is made and marked under a hidden name beside `path` and renamed into place, so that a process killed in
    between never leaves an unmarked directory at `path` (which a later run could not remove, and would refuse
    to reuse). With `exist_ok`, a directory already there is returned as it is, unmarked: this invocation did
    not make it, so nothing proves it may be deleted."""
    if os.path.isdir(path) and exist_ok:
        return os.fspath(path)
    head, name = _split(path)
    make_dirs(head)
    if os.path.lexists(path):
        raise FileExistsError(errno.EEXIST, "exists", os.fspath(path))
    staged = tempfile.mkdtemp(prefix=f".{name}.made-", dir=head)
    try:
        os.chmod(staged, dir_mode())  # exactly, whatever the umask
        mark_made(staged, key, [path, *places])  # the places it may be at (not this one), and its inode
        os.rename(staged, path)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(staged)
        raise
    return os.fspath(path)


def make_temp_dir(prefix: str, parent: str | os.PathLike[str], key: Optional[bytes] = None) -> str:
    """A fresh directory in `parent` (tempfile.mkdtemp: a name no one else has; `dir_mode()`), marked as made
    by this invocation."""
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    os.chmod(path, dir_mode())
    mark_made(path, key)
    return path


def holds_input(directory: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]]) -> Optional[str]:
    """The first of `inputs` that is `directory` or lies inside it, both sides resolved (None: none does)."""
    real = os.path.realpath(directory)
    for item in inputs:
        got = os.path.realpath(item)
        if got == real or got.startswith(real.rstrip(os.sep) + os.sep):
            return os.fspath(item)
    return None


def unmark(path: str | os.PathLike[str]) -> None:
    """Take the marker out of the directory `path` (one whose bytes must be exactly the caller's, as a
    prepared dataset's are); a later delete then needs the caller's own proof (`remove_made_dir`'s `accept`)."""
    dfd = os.open(path, _DIR)
    try:
        os.unlink(MARKER, dir_fd=dfd)
    except FileNotFoundError:
        pass
    finally:
        os.close(dfd)


def made_here(path: str | os.PathLike[str], accept: Optional[Callable[[int], bool]] = None,
              key: Optional[bytes] = None, at: Optional[str | os.PathLike[str]] = None) -> Optional[str]:
    """Why `path` is not a directory this invocation can prove it made (None: it is one: its marker is the
    HMAC under `key`, None for this process's own, of its place and identity, or `accept` given its descriptor
    says it is one of the command's own). `at`: the place it was marked for, when the caller has just moved it
    from there itself (`rrtrain.core.io.replace_dir`)."""
    try:
        dfd = os.open(path, _DIR)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            return "it is a symbolic link"
        return "it is not a directory" if err.errno == errno.ENOTDIR else (err.strerror or type(err).__name__)
    try:
        try:
            got = read_beneath(dfd, MARKER, 4096).decode("ascii", "replace").splitlines(keepends=True)
            want = _marker_line(_place(path if at is None else at), os.fstat(dfd), key)
            why = None if any(hmac.compare_digest(line, want) for line in got) else \
                f"its {MARKER} does not prove this invocation made it (made by another process, copied, or moved)"
        except FileNotFoundError:
            why = f"it has no {MARKER} marker (rrtrain did not make it)"
        except OSError as err:
            why = f"its {MARKER} is {err.strerror or type(err).__name__}"
        if why is not None and accept is not None and accept(dfd):
            return None
        return why
    finally:
        os.close(dfd)


def remove_made_dir(path: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]] = (),
                    missing_ok: bool = True, accept: Optional[Callable[[int], bool]] = None,
                    key: Optional[bytes] = None, at: Optional[str | os.PathLike[str]] = None) -> None:
    """Delete the directory `path` and everything in it, only when this invocation can prove it made it
    (`made_here` with `key` and `at`: its marker, opened without following a link; or, where the command has
    its own proof, `accept(descriptor)`: a prepared dataset's manifest under --overwrite) and it holds none of
    `inputs` (the paths the same command reads); NotMade, one line, otherwise. shutil.rmtree follows no link
    inside."""
    if missing_ok and not os.path.lexists(path):
        return
    held = holds_input(path, inputs)
    if held is not None:
        raise NotMade(errno.EPERM, f"not removed: it holds '{held}', an input of this command", os.fspath(path))
    why = made_here(path, accept, key, at)
    if why is not None:
        raise NotMade(errno.EPERM, f"not removed: {why}", os.fspath(path))
    shutil.rmtree(path)


def discard_made_dir(path: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]] = (),
                     accept: Optional[Callable[[int], bool]] = None, key: Optional[bytes] = None,
                     at: Optional[str | os.PathLike[str]] = None) -> Optional[str]:
    """`remove_made_dir` for clean-up that must not fail: the refusal or error as one line, or None."""
    try:
        remove_made_dir(path, inputs, accept=accept, key=key, at=at)
    except OSError as err:
        return f"{os.fspath(path)}: {err.strerror or type(err).__name__}"
    return None


def remove_file(path: str | os.PathLike[str], missing_ok: bool = True) -> None:
    """Delete the name `path` (a file, or a link itself: unlink never follows one), never a directory."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise


# -- YAML someone else wrote --------------------------------------------------------------------------


#: the most values a YAML document may expand to, each alias counted as everything it repeats (a config holds
#: hundreds; a few lines of nested aliases expand to billions, and whatever walks them hangs)
MAX_YAML_NODES = 100_000
#: the deepest a YAML document may nest (a config nests four or five levels)
MAX_YAML_DEPTH = 64


def load_yaml(text: str, max_nodes: int = MAX_YAML_NODES, max_depth: int = MAX_YAML_DEPTH) -> Any:
    """`yaml.safe_load` of a document someone else may have written, with alias expansion and nesting bounded:
    ValueError (one line) for a document that expands to more than `max_nodes` values, nests deeper than
    `max_depth`, or holds an alias inside its own anchor (a structure that contains itself); yaml.YAMLError for
    one that is not YAML."""
    return _load_with(_bounded_yaml_loader(), text, max_nodes, max_depth)


def _load_with(loader_class: type, text: str, max_nodes: int, max_depth: int) -> Any:
    """One document through a loader of `_bounded_yaml_loader`'s family, with its bounds set. Where PyYAML has
    libyaml, libyaml parses and composes it first (a run's config in ~2 ms against ~16: `rrtrain status` and
    `report` read every run's), and the composed graph is measured against the bounds before anything is
    constructed; a document outside them, or one libyaml refuses, goes through the Python composer, which checks
    the bounds as it composes and says what is wrong in its own words."""
    fast = _libyaml_twin(loader_class)
    if fast is not None:
        read, value = _load_on_libyaml(fast, text, max_nodes, max_depth)
        if read:
            return value
    loader = loader_class(text)
    loader.max_nodes, loader.max_depth = max_nodes, max_depth
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


@functools.lru_cache(maxsize=None)
def _libyaml_twin(loader_class: type) -> Optional[type]:
    """`loader_class`'s constructors over libyaml's parser and composer (PyYAML's CSafeLoader), or None where
    PyYAML was built without libyaml."""
    import yaml

    if not getattr(yaml, "__with_libyaml__", False):
        return None
    return type(f"{loader_class.__name__}OnLibyaml", (yaml.CSafeLoader,),
                {"yaml_constructors": dict(loader_class.yaml_constructors),
                 "yaml_multi_constructors": dict(loader_class.yaml_multi_constructors)})


def _load_on_libyaml(loader_class: type, text: str, max_nodes: int, max_depth: int) -> tuple[bool, Any]:
    """(True, the document) where libyaml reads `text` and its graph is within the bounds; (False, None) where
    libyaml refuses it (text that is not YAML, or that UTF-8 cannot hold) or it is outside the bounds."""
    import yaml

    try:
        loader = loader_class(text)
    except (yaml.YAMLError, UnicodeError):
        return False, None
    try:
        node = loader.get_single_node()
        if node is None:
            return True, None
        if not _within_bounds(node, max_nodes, max_depth):
            return False, None
        return True, loader.construct_document(node)
    except (yaml.YAMLError, UnicodeError):
        return False, None
    finally:
        loader.dispose()


def _within_bounds(root: Any, max_nodes: int, max_depth: int) -> bool:
    """Whether a composed YAML graph stays within the bounds `_bounded_yaml_loader` enforces: at most
    `max_nodes` values with each alias counted at every use (a node shared by aliases is measured once), at most
    `max_depth` levels, and no structure that contains itself."""
    import yaml

    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # the collections being measured, from the root down: met again, a cycle

    def size(node: Any, depth: int) -> Optional[int]:
        if depth > max_depth or id(node) in open_nodes:
            return None
        if id(node) in sizes:
            return sizes[id(node)]
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            sizes[id(node)] = 1
            return 1
        open_nodes.add(id(node))
        total = 1
        for child in children:
            counted = size(child, depth + 1)
            if counted is None or total + counted > max_nodes:
                return None
            total += counted
        open_nodes.discard(id(node))
        sizes[id(node)] = total
        return total

    return size(root, 1) is not None


@functools.lru_cache(maxsize=None)
def _bounded_yaml_loader() -> type:
    """A SafeLoader that counts, as it composes, how many values each node expands to (an alias: its anchor's
    count, already known), so a bound is enforced before anything is constructed; built once, yaml imported
    only by the readers that need it."""
    import yaml

    class BoundedSafeLoader(yaml.SafeLoader):
        max_nodes, max_depth = MAX_YAML_NODES, MAX_YAML_DEPTH

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.expanded: dict[int, int] = {}  # id(node) -> the values it stands for, once composed whole
            self.depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent) and event.anchor in self.anchors \
                    and id(self.anchors[event.anchor]) not in self.expanded:
                raise ValueError(f"the alias *{event.anchor} is inside its own anchor (a structure that contains itself)")
            self.depth += 1
            if self.depth > self.max_depth:
                raise ValueError(f"nested too deeply (more than {self.max_depth} levels)")
            try:
                node = super().compose_node(parent, index)
            finally:
                self.depth -= 1
            size = self.expanded.get(id(node))
            if size is None:
                if isinstance(node, yaml.SequenceNode):
                    size = 1 + sum(self.expanded.get(id(child), 1) for child in node.value)
                elif isinstance(node, yaml.MappingNode):
                    size = 1 + sum(self.expanded.get(id(k), 1) + self.expanded.get(id(v), 1) for k, v in node.value)
                else:
                    size = 1
                self.expanded[id(node)] = size
            if size > self.max_nodes:
                raise ValueError(f"it expands to more than {self.max_nodes:,} values, each alias counted at every use")
            return node

    return BoundedSafeLoader


# -- what rrtrain hands to a library ------------------------------------------------------------------


#: the most entries `regular_tree` walks (a checkpoint of thousands of ranks holds a few thousand files)
MAX_TREE_ENTRIES = 100_000
#: the deepest `regular_tree` descends (a checkpoint nests three levels, a task directory a few)
MAX_TREE_DEPTH = 32


def regular_tree(root: Union[int, str, os.PathLike[str]], max_entries: int = MAX_TREE_ENTRIES,
                 max_depth: int = MAX_TREE_DEPTH) -> dict[str, int]:
    """Every file below the directory `root` (relative path -> size), for a library that is handed the whole
    directory and opens what it finds there itself (DCP, DeepSpeed, lm-eval, datasets), where the layer cannot
    open each file for it. Each directory is opened relative to its parent's descriptor without following a
    link, so what is checked is what is there: LinkRefused for a symbolic link anywhere below `root`,
    NotRegular for anything that is neither a regular file nor a directory (a FIFO would hang the library, a
    device feed it forever), OSError E2BIG past `max_entries` entries or `max_depth` levels. `root` itself is
    named by the caller and taken as given."""
    where = os.fspath(root) if not isinstance(root, int) else "."
    found: dict[str, int] = {}
    seen = 0

    def walk(dfd: int, prefix: str, depth: int) -> None:
        nonlocal seen
        if depth > max_depth:
            raise OSError(errno.E2BIG, f"nested deeper than {max_depth} levels", os.path.join(where, prefix))
        with os.scandir(dfd) as entries:
            names = sorted(entry.name for entry in entries)
        for name in names:
            seen += 1
            if seen > max_entries:
                raise OSError(errno.E2BIG, f"more than {max_entries} entries", where)
            rel = os.path.join(prefix, name) if prefix else name
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise LinkRefused(errno.ELOOP, "a symbolic link (not followed)", os.path.join(where, rel))
            if stat.S_ISREG(st.st_mode):
                found[rel] = st.st_size
            elif stat.S_ISDIR(st.st_mode):
                try:
                    nfd = os.open(name, _DIR, dir_fd=dfd)
                except OSError as err:
                    raise _refusal(err, dfd, name, os.path.join(where, rel), last=False) from None
                try:
                    walk(nfd, rel, depth + 1)
                finally:
                    os.close(nfd)
            else:
                raise NotRegular(0, "not a regular file", os.path.join(where, rel))

    top = os.dup(root) if isinstance(root, int) else open_root(root)
    try:
        walk(top, "", 0)
    finally:
        os.close(top)
    return found


class Tagged(tuple):
    """A YAML scalar written with a local tag of its reader's own (`!function utils.f`): (tag, text)."""

    @property
    def tag(self) -> str:
        return self[0]

    @property
    def value(self) -> str:
        return self[1]


def load_yaml_tagged(text: str, tags: Iterable[str], max_nodes: int = MAX_YAML_NODES,
                     max_depth: int = MAX_YAML_DEPTH) -> Any:
    """`load_yaml` of a document that also uses local tags (lm-eval's `!function`): a scalar written with one
    of `tags` is read as a `Tagged` (tag, text), never acted on; every other tag is refused as `load_yaml`
    refuses it (yaml.YAMLError)."""
    return _load_with(_tagged_yaml_loader(tuple(sorted(tags))), text, max_nodes, max_depth)


@functools.lru_cache(maxsize=None)
def _tagged_yaml_loader(tags: tuple[str, ...]) -> type:
    base = _bounded_yaml_loader()

    class TaggedLoader(base):  # type: ignore[misc, valid-type]
        pass

    for tag in tags:
        TaggedLoader.add_constructor(tag, lambda loader, node: Tagged((node.tag, str(loader.construct_scalar(node)))))
    return TaggedLoader


def said(err: OSError) -> str:
    """An OSError of the layer (or the kernel's) in words for a one-line refusal: `PATH: reason`."""
    reason = err.strerror or str(err) or type(err).__name__
    return f"{os.fspath(err.filename)}: {reason}" if err.filename is not None else reason
