"""Opening a file that someone else may have put there: a run's files, a sweep's record, a dataset's manifest, a
config. Only a regular file is read (a FIFO would block the reader forever, `/dev/zero` would fill memory), and
a whole-file read stops at a size limit, so that no file a reader is pointed at can hang it or exhaust it."""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

#: the largest JSON or YAML file read whole (sweep.json of a thousand runs is a few MB)
MAX_BYTES = 256 * 1024 * 1024


class NotRegular(OSError):
    """The path is there but is not a regular file (a FIFO, a device, a directory)."""


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """`path` opened for binary reading, when it is a regular file (symlinks followed); FileNotFoundError when it
    is missing, NotRegular (an OSError) when it is something else. Opened non-blocking, so a FIFO does not
    wait for a writer."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegular(0, "not a regular file", os.fspath(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_lock_file(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """A lock file's descriptor, opened read-write and created when missing, never through a symbolic link
    (OSError ELOOP: a planted link would make the opener create a file elsewhere) and only when it is a regular
    file (NotRegular: a FIFO would block the opener). flock(2) works on it as on any descriptor."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), mode)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegular(0, "not a regular file", os.fspath(path))
    return fd


def read_bytes(path: str | os.PathLike[str], limit: int = MAX_BYTES) -> bytes:
    """The whole of a regular file of at most `limit` bytes; OSError (NotRegular, FileNotFoundError, or a
    too-large file, errno EFBIG) otherwise."""
    with open_regular(path) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        import errno

        raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
    return data
