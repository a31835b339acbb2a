"""How every command ends: a `UsageError` is one line and exit status 2, a `RunError` one line and 1, an
OSError naming a path the user can put right (no permission, a file where a directory belongs, a link or FIFO
the file layer refused: `path_refusal`) one line naming the path and 2, never a traceback; output into a pipe
whose reader has gone (`rrtrain status | head`) ends quietly with 141, as a tool killed by SIGPIPE does; a
distributed run ends its process without finalising. Shared by `rrtrain NAME` (rrtrain.cli.main) and `python -m
rrtrain.train` (torchrun's entry), which sit at different layers."""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
from typing import Callable, Optional

from rrtrain.core import files
from rrtrain.core.errors import RUN_ERROR_EXIT, RunError, UsageError, fail


def run_command(prog: str, entry: Callable[[list[str]], int], argv: list[str]) -> int:
    """`entry(argv)`'s exit status, with bad input and run errors said in one line under `prog`."""
    try:
        with files.private_umask():  # what any library writes for the command is the user's alone too
            code = int(entry(argv) or 0)
        sys.stdout.flush()  # a gone reader shows here, not as "Exception ignored" at interpreter exit
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # another pipe (a child's, a socket): a real failure, with its traceback
        code = _quiet_stdout()
    except UsageError as err:
        code = fail(prog, str(err))
    except RunError as err:
        fail(prog, str(err))
        code = RUN_ERROR_EXIT
    except OSError as err:
        line = path_refusal(err)
        if line is None:
            raise  # a disk error, a bug: its traceback is what is needed to find it
        code = fail(prog, line)
    if code:
        import gc

        # a failed run's objects sit in cycles with the traceback; freed now, streaming releases its shared
        # memory before exit instead of warning about it then
        gc.collect()
    dist = sys.modules.get("rrtrain.core.dist")  # not imported by commands that load no torch (status)
    if dist is not None and dist.started_group():
        dist.exit_process(code)  # a distributed train/bench: end without finalising (see exit_process)
    return code


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or socket whose reader has closed it (poll reports an error on the write end)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _quiet_stdout() -> int:
    """Send what stdout still buffers nowhere, so that Python's own flush at exit does not fail a second time;
    the exit status of a process killed by SIGPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


#: errno of an OSError that says a path the user named is not one the command can read or use, which the user can
#: put right (EACCES, EPERM: a directory they cannot enter; EISDIR, ENOTDIR: a file where a directory belongs, or
#: the other way; ENOENT; ELOOP: a link the file layer does not follow; ENXIO: a FIFO; ENAMETOOLONG)
PATH_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.ENOENT, errno.ELOOP,
                         errno.ENXIO, errno.ENAMETOOLONG})


def path_refusal(err: OSError) -> Optional[str]:
    """The one line for an OSError about a path the user can put right: one that names its path and is one of
    the file layer's refusals (`files.LinkRefused`, `NotRegular`, `BadPath`, `TooLarge`) or of `PATH_ERRNOS`
    (a run directory they cannot enter read by `rrtrain eval`, a sweep directory `--cancel-flagged` cannot write);
    None for any other (a full disk, an I/O error), which stays a traceback. One place for every command, so no
    reader has to catch what it cannot foresee."""
    if err.filename is None:
        return None
    layer = (files.LinkRefused, files.NotRegular, files.BadPath, files.TooLarge)
    if not isinstance(err, layer) and err.errno not in PATH_ERRNOS:
        return None
    return f"{files.said(err)} (check that the path is the one meant, and yours to read and write there)"
