"""Atomic output directories: build beside OUT, publish with a rename, never leave OUT half-written.

An interrupted prep (SIGINT, SIGTERM, an error) removes its staging directory; a killed one
(SIGKILL) leaves only a hidden `.NAME.tmp-HOST-PID-*` sibling, which the next prep removes once that
process is gone. With `--overwrite` the old OUT is swapped out in one `renameat2(RENAME_EXCHANGE)`
where the OS has it, else moved aside first, and deleted only after the new OUT is in place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from typing import Iterator

from rrtrain.core.errors import UsageError
from rrtrain.core.io import replace_dir


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _host() -> str:
    return socket.gethostname().replace("-", "_")[:32] or "host"


def remove_stale_staging(parent: str, name: str) -> None:
    """Delete staging dirs left by killed preps of the same OUT on this host."""
    prefix = f".{name}.tmp-{_host()}-"
    for entry in os.listdir(parent):
        if not entry.startswith(prefix):
            continue
        try:
            pid = int(entry[len(prefix):].split("-", 1)[0])
        except ValueError:
            continue
        if not _pid_alive(pid):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def check_target(out: str, overwrite: bool) -> None:
    """Refuse an OUT that is a file, or a non-empty directory without --overwrite."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"output '{out}' exists and is not a directory")
    if os.path.isdir(out) and os.listdir(out) and not overwrite:
        raise UsageError(f"output '{out}' exists and is not empty (use --overwrite to replace it)")


@contextlib.contextmanager
def staged_output(out: str, overwrite: bool) -> Iterator[str]:
    """Yield a fresh staging dir beside OUT; publish it on success, delete it on any exception."""
    out = os.path.abspath(out)
    check_target(out, overwrite)
    parent, name = os.path.split(out)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create '{parent}': {err.strerror or err}") from err
    if not os.access(parent, os.W_OK):
        raise UsageError(f"cannot write in '{parent}': permission denied")
    remove_stale_staging(parent, name)
    staging = tempfile.mkdtemp(prefix=f".{name}.tmp-{_host()}-{os.getpid()}-", dir=parent)
    try:
        yield staging
        check_target(out, overwrite)  # someone may have filled OUT meanwhile
        replace_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
