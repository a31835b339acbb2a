"""Atomic writes: a reader never sees a half-written file (write aside, fsync, rename)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside `target`; rename it onto `target` if the block succeeds.

    The temporary name keeps the target's suffix (matplotlib picks a format from it) and starts with a
    dot, so a crash leaves at most a hidden `.name.*.tmp<suffix>` file and never a partial `target`.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=f".tmp{target.suffix}", dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs should read like any other file
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` atomically, flushed to disk before the rename."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def unwritable_reason(directory: str | os.PathLike[str]) -> str | None:
    """Why files cannot be written in `directory` (created when missing), or None when they can.

    Tries what a run does: create the directory, then create, write and remove a hidden file in it. As root,
    permission bits do not stop writes, so this catches what does: read-only mounts and files in the way."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
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
    return None
