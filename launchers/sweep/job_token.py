"""The mark that proves a Slurm job was submitted by this user for this sweep directory.

`rrtrain sweep --cancel-flagged` cancels the jobs a sweep's record names. The record is a file in the sweep
directory, so it cannot vouch for itself: a forged `sweep.json` could name any job of the user's, and a job name
or a token copied into it proves nothing, since anyone can read every job's name and comment from `squeue`.
So each job carries, as its Slurm comment, an HMAC of the sweep directory's resolved path under a key only the
user can read (`$XDG_CONFIG_HOME/rrtrain`, default `~/.config/rrtrain`; made once, 0600 in a 0700 directory).
Slurm keeps the comment from submission on; a cancellation recomputes the mark for the directory it was given
and cancels a recorded job only when Slurm shows that very comment. A record naming another sweep's job, or a
job rrtrain did not submit, names a job whose comment differs, and nothing is cancelled. A sweep directory moved
after submission no longer matches its jobs: they are left alone (the safe side), and cancelled by hand.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from rrtrain.core import files
from rrtrain.core.errors import UsageError

#: what every mark starts with, so a comment rrtrain wrote is told from one the user set
PREFIX = "rrtrain:"


def key_dir() -> Path:
    """Where the user's key lives: `$XDG_CONFIG_HOME/rrtrain`, or `~/.config/rrtrain`."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "rrtrain"


def user_key() -> bytes:
    """The user's key (made on first use). Refused in one line when its directory is not the user's alone."""
    directory = key_dir()
    why = files.prepare_private_dir(directory)
    if why is None and os.stat(directory).st_mode & 0o077:
        why = "others may read it"
    if why is not None:
        raise UsageError(f"{directory} cannot hold the key that marks your Slurm jobs: {why}")
    return files.directory_key(directory)


def job_mark(sweep_dir: Path) -> str:
    """The Slurm comment of every job submitted for `sweep_dir` (resolved: a link to it marks the same)."""
    place = os.fsencode(os.path.realpath(sweep_dir))
    return PREFIX + hmac.new(user_key(), place, hashlib.sha256).hexdigest()[:40]


def carries_mark(comment: str, sweep_dir: Path) -> bool:
    """Whether a job's Slurm comment is this sweep directory's mark."""
    return hmac.compare_digest(comment.strip(), job_mark(sweep_dir))
