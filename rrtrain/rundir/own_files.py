"""What the trainer finds at its own names in its run directory, checked once, before it writes anything there.

Every name in `layout` that the trainer reads, replaces or appends to must be what rrtrain would have put there:
a file a regular file (readable, not larger than rrtrain ever writes it), a directory a directory. Anything else
-- a FIFO (a reader or an appender would block on it), a directory where a file belongs, a symbolic link where a
file belongs (an append would write through it, wherever it points), a file that cannot be read -- is refused
in one line naming the file and what it is, and is left exactly as it is: the user moves it away and starts
the run again. A directory may be a symbolic link to a directory (checkpoints or TensorBoard files on another
filesystem, on purpose), except `artifact/`, which `rrtrain export`, `rrtrain eval` and a warm start read as the
run's own: of the model's state, a link is followed at `checkpoints/` alone (docs/reliability.md, "Where rrtrain
follows a link"). Under `checkpoints/`: `latest` is a file, each `step_*` a directory and not a link. `run.lock` is
the lock's own business (`rrtrain.rundir.lock`).
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path
from typing import Optional

from rrtrain.core import files
from rrtrain.rundir import layout

#: files the trainer reads whole or replaces: never larger than this when rrtrain wrote them (a few kB)
MAX_JSON_BYTES = files.LIMITS["json"]
#: file name -> the most bytes it may hold (None: no whole-file limit; metrics.jsonl is read line by line)
FILES: dict[str, Optional[int]] = {
    layout.CONFIG: MAX_JSON_BYTES,
    layout.METRICS: None,
    layout.FINAL: MAX_JSON_BYTES,
    layout.PAUSE: MAX_JSON_BYTES,
    layout.CANCELLED: MAX_JSON_BYTES,
    layout.PARAMETRIZATION: MAX_JSON_BYTES,
    layout.INIT: MAX_JSON_BYTES,
}
#: directories the trainer writes into
DIRS = (layout.TENSORBOARD, layout.CHECKPOINTS, layout.ARTIFACT, layout.RANKS, layout.DATA_CACHE, layout.WANDB)
#: of those, the ones that must not be a link (the model's state is followed through a link at checkpoints/ alone)
UNLINKED = frozenset({layout.ARTIFACT})
#: what a refused link is told
LINK_RULE = "rrtrain follows a link at checkpoints/ only"

_KINDS = ((stat.S_ISREG, "a file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISLNK, "a symbolic link"))


def kind(mode: int) -> str:
    """What a file of this mode is, in words ("a FIFO")."""
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def _target(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def file_problem(path: Path, limit: Optional[int]) -> Optional[str]:
    """Why `path` cannot be one of the run's own files (None: missing, or a readable regular file within
    `limit` bytes)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"cannot be examined ({err.strerror or err})"
    if stat.S_ISLNK(st.st_mode):
        return f"is a symbolic link (to {_target(path)!r}); rrtrain writes this file itself, in the run directory"
    if not stat.S_ISREG(st.st_mode):
        return f"is {kind(st.st_mode)}, not a file"
    if limit is not None and st.st_size > limit:
        return f"is {st.st_size} bytes, more than rrtrain ever writes there ({limit})"
    try:
        files.open_regular(path).close()  # readable by this user (and still a regular file)
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    return None


def dir_problem(path: Path, link: bool = True) -> Optional[str]:
    """Why `path` cannot be one of the run's own directories (None: missing, or a directory, through a
    symbolic link or, when not `link`, only as a directory itself)."""
    if not link and os.path.islink(path):
        return f"is a symbolic link (to {_target(path)!r}): {LINK_RULE}"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "is a symbolic link to nothing" if os.path.islink(path) else None
    except OSError as err:
        return f"cannot be examined ({err.strerror or err})"
    return None if stat.S_ISDIR(st.st_mode) else f"is {kind(st.st_mode)}, not a directory"


def checkpoint_entries(root: Path) -> list[tuple[Path, Optional[str]]]:
    """The names under `checkpoints/` that a save replaces or a resume reads: `latest` (a file), `step_*` and
    rrtrain's own `.tmp_step_*` (directories, not links); anything else there is not rrtrain's and is left alone."""
    try:
        names = sorted(os.listdir(root))
    except OSError:  # missing; or not a directory, which `dir_problem` says
        return []
    found = [(root / "latest", file_problem(root / "latest", MAX_JSON_BYTES))]
    return found + [(root / n, dir_problem(root / n, link=False)) for n in names
                    if n.startswith(("step_", ".tmp_step_"))]


def problem(run_dir: str | os.PathLike[str]) -> Optional[str]:
    """One line naming the first of the run's own names that holds something rrtrain cannot use, and what to
    do; None when all are fine."""
    root = Path(run_dir)
    found = [(root / name, file_problem(root / name, limit)) for name, limit in FILES.items()]
    dirs = (*DIRS, f"{layout.DATA_CACHE}/{socket.gethostname()}")  # this node's loader cache
    found += [(root / name, dir_problem(root / name, link=name not in UNLINKED)) for name in dirs]
    found += checkpoint_entries(root / layout.CHECKPOINTS)
    for path, why in found:
        if why:
            return f"{path} {why}: move it out of the run directory and start the run again (it is left as it is)"
    return None
