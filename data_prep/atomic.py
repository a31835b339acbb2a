"""Atomic output directories: build beside OUT, publish with a rename, never leave OUT half-written.

An interrupted prep (SIGINT, SIGTERM, an error) removes its staging directory; a killed one
(SIGKILL) leaves only a hidden `.NAME.tmp-HOST-PID-*` sibling, which the next prep names in a one-line
warning once that process is gone and leaves: nothing proves this invocation made it (`files.made_here`).
With `--overwrite` the old OUT is swapped out in one `renameat2(RENAME_EXCHANGE)` where the OS has it, else moved aside first, and deleted only after the new OUT is in place; `--overwrite`
replaces only an empty directory or one that is wholly an rrtrain dataset (its manifest, tokenizer and split
directories of index and shards, nothing else: `dataset_problem`), never the working directory, a parent of
it or a home directory. OUT must be the user's alone (`files.check_private_path`), and the published
directory is too: 0700 and its files 0600 (0750 / 0640 under RRTRAIN_GROUP_READ=1), whatever the umask.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import stat
import sys
from typing import Iterable, Iterator, Optional

from data_prep.manifest import MANIFEST, SPLITS

from rrtrain.core import files
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
    """Staging dirs left by killed preps of the same OUT on this host: deleted only when this invocation can
    prove it made them (`files.discard_made_dir`), else named on stderr in one line and left."""
    prefix = f".{name}.tmp-{_host()}-"
    for entry in os.listdir(parent):
        if not entry.startswith(prefix):
            continue
        try:
            pid = int(entry[len(prefix):].split("-", 1)[0])
        except ValueError:
            continue
        if not _pid_alive(pid):
            why = files.discard_made_dir(os.path.join(parent, entry))  # only what this invocation proves it made
            if why is not None:
                print(f"rrtrain prep: warning: kept the staging directory of a prep that is gone, {why}; delete "
                      "it yourself when it is not needed", file=sys.stderr, flush=True)


def _homes() -> set[str]:
    """Every home directory this machine knows ($HOME and the password database's)."""
    homes = {os.path.expanduser("~")}
    with contextlib.suppress(Exception):
        import pwd

        homes.update(p.pw_dir for p in pwd.getpwall() if p.pw_dir)
    return {os.path.realpath(h) for h in homes if h}


#: the files `rrtrain prep` writes at the top of OUT (data_prep/manifest.py, the tokenizer's save), and the
#: marker an older prep left: with the split directories, all that --overwrite may replace
DATASET_FILES = frozenset({MANIFEST, "tokenizer.json", files.MARKER})
#: what a split directory holds (data_prep/writer.py's MDSWriter: the index and its numbered shards, each maybe
#: compressed)
SPLIT_FILE = re.compile(r"index\.json|shard\.[0-9]{5,}\.mds(\.[a-z0-9]+)?")


def dataset_problem(path: str | int) -> Optional[str]:
    """Why a directory (a path, or a descriptor) is not wholly an rrtrain dataset (None: it is): it must hold a
    manifest.json that is a JSON object with the keys `rrtrain prep` writes (format_version, fingerprint) and
    nothing but what prep writes (`DATASET_FILES`, the split directories of index.json and shards), each a
    regular file or a directory, none a link. A copied manifest is no proof: whatever else is there is not
    part of a dataset, and --overwrite never deletes it."""
    try:  # a regular file only and at most 1 MiB: a FIFO planted there would block prep, /dev/zero fill memory
        manifest = json.loads(files.read_beneath(path, MANIFEST, 1 << 20))
    except (OSError, ValueError, RecursionError):
        manifest = None
    if not (isinstance(manifest, dict) and "format_version" in manifest and "fingerprint" in manifest):
        return f"no {MANIFEST} written by `rrtrain prep`"
    dfd = os.dup(path) if isinstance(path, int) else files.open_root(path)
    try:
        for name in sorted(os.listdir(dfd)):
            kind = stat.S_IFMT(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
            if name in DATASET_FILES and kind == stat.S_IFREG:
                continue
            if name not in SPLITS or kind != stat.S_IFDIR:
                return f"'{name}' is not part of one"
            sfd = files.open_beneath(dfd, name, directory=True)
            try:
                for entry in sorted(os.listdir(sfd)):
                    if not (SPLIT_FILE.fullmatch(entry) and stat.S_ISREG(
                            os.stat(entry, dir_fd=sfd, follow_symlinks=False).st_mode)):
                        return f"'{name}/{entry}' is not part of one"
            finally:
                os.close(sfd)
    except OSError as err:
        return f"it cannot be listed ({err.strerror or type(err).__name__})"
    finally:
        os.close(dfd)
    return None


def holds_dataset(path: str | int) -> bool:
    """Whether a directory (a path, or a descriptor) is wholly an rrtrain dataset (`dataset_problem`): what
    --overwrite may delete."""
    return dataset_problem(path) is None


def check_target(out: str, overwrite: bool) -> None:
    """Refuse an OUT that is a file, a non-empty directory without --overwrite, and, even with --overwrite,
    anything but an empty directory or one holding an rrtrain dataset: never the working directory or a
    parent of it, never a home directory."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"output '{out}' exists and is not a directory")
    if not os.path.isdir(out) or not os.listdir(out):
        return
    if not overwrite:
        raise UsageError(f"output '{out}' exists and is not empty (use --overwrite to replace it)")
    real, cwd = os.path.realpath(out), os.path.realpath(os.getcwd())
    if cwd == real or cwd.startswith(real.rstrip(os.sep) + os.sep):
        raise UsageError(f"output '{out}' is the working directory or a parent of it: --overwrite never "
                         "replaces it; choose a new directory for the dataset")
    if real in _homes():
        raise UsageError(f"output '{out}' is a home directory: --overwrite never replaces it; choose a new "
                         "directory for the dataset")
    why = dataset_problem(out)
    if why is not None:
        raise UsageError(f"output '{out}' is not empty and holds no rrtrain dataset ({why}): --overwrite replaces "
                         "only a dataset `rrtrain prep` wrote, nothing beside it; choose a new directory")


def check_inputs_outside(out: str, inputs: Iterable[str]) -> None:
    """Refuse an OUT that is, or holds, one of the command's own inputs (the source corpus, a tokenizer
    directory): replacing OUT would delete what was just read. Both sides are resolved, links included."""
    real_out = os.path.realpath(out)
    for path in inputs:
        real = os.path.realpath(path)
        if real == real_out or real.startswith(real_out.rstrip(os.sep) + os.sep):
            raise UsageError(f"output '{out}' holds the input '{path}': replacing it would delete what prep reads; "
                             "write the dataset to another directory")


@contextlib.contextmanager
def staged_output(out: str, overwrite: bool, inputs: Iterable[str] = ()) -> Iterator[str]:
    """Yield a fresh staging dir beside OUT; publish it on success, delete it on any exception. `inputs`: the
    local paths the command reads, which OUT must not hold."""
    out, inputs = os.path.abspath(out), list(inputs)
    check_inputs_outside(out, inputs)
    check_target(out, overwrite)
    parent, name = os.path.split(out)
    files.check_private_path(out, f"output '{out}'")
    try:
        files.make_dirs(parent)
    except OSError as err:
        raise UsageError(f"cannot create '{parent}': {err.strerror or err}") from err
    if not os.access(parent, os.W_OK):
        raise UsageError(f"cannot write in '{parent}': permission denied")
    remove_stale_staging(parent, name)
    files.check_private_path(out, f"output '{out}'")  # again, now that its parent is made
    staging = files.make_temp_dir(f".{name}.tmp-{_host()}-{os.getpid()}-", parent)  # marked: made here
    try:
        yield staging
        files.set_private_modes(staging)  # whatever modes the writers chose: the user's alone
        check_target(out, overwrite)  # someone may have filled OUT meanwhile
        files.unmark(staging)  # a dataset's bytes are the same from any prep: no marker naming an inode in it
        # the old OUT is deleted only when it holds a dataset (checked through its own descriptor) and no input
        replace_dir(staging, out, inputs, mark=False, accept=holds_dataset)
    except BaseException:
        if os.path.isdir(staging):
            files.mark_made(staging)
            files.discard_made_dir(staging)
        raise
