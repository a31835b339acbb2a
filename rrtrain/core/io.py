"""Atomic writes: a reader never sees a half-written file or directory (write aside, fsync, rename)."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

from rrtrain.core import files


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `target`; rename it onto `target` if the block succeeds.

    The temporary name keeps the target's suffix (matplotlib picks a format from it) and starts with a
    dot, so a crash leaves at most a hidden `.name.*.tmp<suffix>` file and never a partial `target`. The file
    published is `files.file_mode()` (the user's alone), whatever mode the library that wrote it chose.
    """
    target = Path(target)
    files.make_dirs(target.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=f".tmp{target.suffix}", dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        files.chmod_here(tmp, files.file_mode())  # a writer may have replaced mkstemp's file
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` atomically, flushed to disk before the rename (`files.atomic_write_file`: the
    temporary file made and renamed relative to the directory's descriptor, a link at `path` replaced, never
    written through)."""
    files.atomic_write_file(path, data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def finite_or_null(obj: Any) -> Any:
    """`obj` with every non-finite float (NaN, ±Infinity, which JSON has no words for) replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write `obj` as JSON, atomically. Always valid JSON: a non-finite number is written as null (a writer that
    must say why, as final.json does, says so in a field of its own)."""
    atomic_write_text(path, json_text(obj))


def json_text(obj: Any) -> str:
    """`obj` as rrtrain writes JSON files: indented, keys sorted, non-finite numbers as null, a final newline."""
    return json.dumps(finite_or_null(obj), indent=2, sort_keys=True, allow_nan=False) + "\n"


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Atomically swap two paths (Linux renameat2); False where unsupported."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return False
    try:
        fn = ctypes.CDLL(libc_name, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def replace_dir(staging: str | os.PathLike[str], target: str | os.PathLike[str],
                inputs: Iterable[str | os.PathLike[str]] = (), mark: bool = True,
                accept: Optional[Callable[[int], bool]] = None, key: Optional[bytes] = None) -> None:
    """Move the finished directory `staging` (made by the caller) to `target`. An existing `target` stays whole
    until the new one is in its place (swapped in one renameat2 where the OS has it, else moved aside first)
    and is deleted only then, so an interruption leaves the old directory or the new one under `target`, never
    neither. `staging` is marked as made (`files.mark_made` under `key`, for its own place and `target`) before
    it moves in, unless `mark` is False; the old `target` is deleted only when its marker proves it made for
    `target` under `key` (or `accept`, given its descriptor, proves it the command's own) and it holds none of
    `inputs` (the command's own inputs), else it is left beside `target` and said on stderr in one line."""
    staging, target = os.fspath(staging), os.fspath(target)
    inputs = list(inputs)
    held = files.holds_input(target, inputs)  # checked before the swap moves the old target to another name
    if held is not None:
        raise files.NotMade(errno.EPERM, f"not replaced: it holds '{held}', an input of this command", target)
    if mark:
        files.mark_made(staging, key, [staging, target])  # proven where it is and where it goes, nowhere else
    if not os.path.exists(target) or (os.path.isdir(target) and not os.listdir(target)):
        os.rename(staging, target)  # rename(2) replaces an empty directory atomically
        return
    old = staging  # after the swap, staging's name holds the old target
    if not _exchange(staging, target):
        old = staging + ".old"
        os.rename(target, old)
        try:
            os.rename(staging, target)
        except BaseException:
            os.rename(old, target)
            raise
    _discard_old(old, inputs, accept, key, target)


def _discard_old(path: str, inputs: list[str | os.PathLike[str]], accept: Optional[Callable[[int], bool]],
                 key: Optional[bytes], was_at: str) -> None:
    """Delete a replaced directory, just moved here from `was_at`, when its marker proves it made for that
    place (or `accept` does); otherwise leave it and say so."""
    why = files.discard_made_dir(path, inputs, accept, key, at=was_at)
    if why is not None:
        print(f"rrtrain: the replaced directory was kept as {why}; delete it yourself when it is not needed",
              file=sys.stderr)


def unwritable_reason(directory: str | os.PathLike[str]) -> str | None:
    """Why files cannot be written in `directory` (created when missing), or None when they can.

    First rrtrain's own rule: nothing is written (nor resumed, nor run) where someone other than the user or
    root can write, on the way included (`files.private_path_problem`, checked again once the directory is
    made, so one slipped in meanwhile is caught). Then tries what a run does: create the directory
    (`files.make_dirs`: the user's alone), then create, write and remove a hidden file in it. As root,
    permission bits do not stop writes, so this catches what does: read-only mounts and files in the way."""
    unsafe = files.private_path_problem(directory)
    if unsafe is not None:
        return files.explained(unsafe)
    path = Path(directory)
    try:
        files.make_dirs(path)
        fd, probe = tempfile.mkstemp(prefix=".write_probe.", dir=path)
        try:
            os.write(fd, b"ok")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except FileExistsError:
        return "a file is in the way (it is not a directory)"
    except OSError as err:
        where = f" ({err.filename})" if err.filename and str(err.filename) != str(path) else ""
        return f"{err.strerror or type(err).__name__}{where}"
    unsafe = files.private_path_problem(directory)
    return None if unsafe is None else files.explained(unsafe)
