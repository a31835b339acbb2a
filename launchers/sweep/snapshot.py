"""A copy of the code, taken once per sweep, that every run of the sweep imports first (PYTHONPATH), so
edits made after submission do not leak into queued or requeued runs.

The sweep directory may be writable by others, and whatever lies in the snapshot runs in every run (a module,
a `sitecustomize.py`, a `*.dist-info` entry point, a `.pyc`), so `sweep.json` never chooses the code: the
snapshot's place is one rrtrain derives (`SWEEP/code`, or `SWEEP/code-HASH`), and it is used only while a hash
of every entry under it (names, kinds, modes, contents; nothing skipped) equals the one recorded when it was
taken and all of it is the user's own; otherwise the submission is refused in one line. Each run checks the
same again when it starts, against the hash its job carries (`launchers.sweep.seal`). Runs are started with
PYTHONDONTWRITEBYTECODE=1 (`NO_BYTECODE`), so that importing from the snapshot adds nothing to it.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Optional

from launchers.sweep import seal
from rrtrain.core import files
from rrtrain.core.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("rrtrain", "data_prep", "launchers", "configs")
#: what a snapshot's `hash` field says when `sha256` covers every entry of the snapshot (`tree_hash`); a
#: record without it was written by an older rrtrain, whose hash skipped `__pycache__`
HASH_KIND = "every-entry-v1"
#: the environment every run of a sweep starts with, beside the snapshot on PYTHONPATH
NO_BYTECODE = {"PYTHONDONTWRITEBYTECODE": "1"}


def _copied_mode(mode: int) -> int:
    """The permissions an entry gets in a snapshot: the user's alone (`files.dir_mode()` for a directory or an
    executable, `files.file_mode()` for a file); under RRTRAIN_GROUP_READ=1 the group may read, never write."""
    if stat.S_ISDIR(mode) or mode & stat.S_IXUSR:
        return files.dir_mode()
    return files.file_mode()


def tree_hash(root: Path, source: bool = False) -> str:
    """SHA-256 of every entry under `root` (`launchers.sweep.seal.tree_hash`, which a job runs on its own before
    it imports anything of the snapshot); `source`: of the checkout's packages as a snapshot of them holds them."""
    return seal.tree_hash(root, PACKAGES, _copied_mode) if source else seal.tree_hash(root)


def code_hash(root: Path = REPO) -> str:
    """The hash a snapshot of the checkout at `root` has (`tree_hash` of what `take` copies)."""
    return tree_hash(root, source=True)


def _real_dir(path: Path) -> bool:
    """A directory itself, not a link to one."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _entry(target: Path, digest: str) -> dict[str, Any]:
    """The record of the snapshot at `target`, once no one else can write it or the way to it (its runs
    import from it)."""
    files.check_private_path(target, "the sweep's code snapshot")
    return {"path": str(target.resolve()), "sha256": digest, "hash": HASH_KIND, "source": str(REPO)}


def _places(out: Path, digest: str) -> tuple[Path, Path]:
    """Where a snapshot of code with this hash may lie: `code`, or `code-HASH` beside another one."""
    return out / "code", out / f"code-{digest[:12]}"


def _all_mine(root: Path) -> bool:
    """Whether this user owns `root` and every entry under it: no one else can have made or replaced any of it
    (another user's files hash alike, but are that user's code)."""
    uid = os.getuid()
    return all(os.lstat(p).st_uid == uid for p in [root, *root.rglob("*")])


def _matches(target: Path, digest: str) -> bool:
    """Whether `target` is a directory of this user's holding exactly the snapshot hashed `digest`."""
    try:
        return _real_dir(target) and tree_hash(target) == digest and _all_mine(target)
    except OSError:
        return False


def _recorded(out: Path, recorded: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The snapshot sweep.json records, once it proved itself: None when it is gone or was hashed by an older
    rrtrain (a fresh snapshot is taken); UsageError when it lies where rrtrain puts none, or its files are no
    longer the ones hashed when it was taken."""
    digest, path = recorded.get("sha256"), recorded.get("path")
    if recorded.get("hash") != HASH_KIND or not isinstance(digest, str) or len(digest) != 64:
        print("the sweep's code snapshot was recorded by an older rrtrain, which hashed only part of it: "
              "taking a fresh one", flush=True)
        return None
    places = [str(p.resolve()) for p in _places(out, digest)]
    if not isinstance(path, str) or str(Path(path).resolve()) not in places:
        raise UsageError(f"sweep.json names {str(path)[:200]!r} as the code snapshot, which is not where rrtrain "
                         f"puts one ({' or '.join(places)}): refusing to run code from it; repair sweep.json")
    target = Path(places[places.index(str(Path(path).resolve()))])
    if not target.exists() and not target.is_symlink():
        return None
    if not _matches(target, digest):
        raise UsageError(f"{target}: the sweep's code snapshot is not what was taken (a file was changed or "
                         "added since, or is a link, or is not yours): refusing to run code from it; move it aside and submit "
                         "again for a fresh one")
    return _entry(target, digest)


def take(out: Path, recorded: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's snapshot: the recorded one when it is still there and holds what was taken (`_recorded`);
    else `SWEEP_DIR/code` when it holds this very code; else a fresh copy (written aside, renamed) into `code`,
    or beside it into `code-HASH` when `code` holds other code. A snapshot is never deleted or replaced here:
    queued and running jobs import from it (the caller holds the sweep's lock, `launchers.sweep.lock`, so no
    other submission copies meanwhile)."""
    out = Path(out)
    if recorded:
        found = _recorded(out, recorded)
        if found is not None:
            return found
    digest = code_hash()
    first, beside = _places(out, digest)
    target = first
    if _matches(first, digest):
        return _entry(first, digest)
    if first.exists() or first.is_symlink():
        target = beside  # `code` is another snapshot, perhaps in use: keep it
        if _matches(beside, digest):
            return _entry(beside, digest)
        if beside.exists() or beside.is_symlink():
            raise UsageError(f"{beside} is not a snapshot of this code (a file in it differs, or was added): "
                             "refusing to run code from it; move it aside and submit again")
    # a `.code.tmp-*` that a submission killed while copying left is not removed: nothing proves rrtrain made it
    tmp = Path(tempfile.mkdtemp(prefix=".code.tmp-", dir=out))
    tmp.chmod(files.dir_mode())
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, tmp / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path in [tmp] + list(tmp.rglob("*")):  # nobody but the owner may add to it or change it
        os.chmod(path, _copied_mode(os.lstat(path).st_mode))
    if tree_hash(tmp) != digest:  # the checkout changed while it was copied
        shutil.rmtree(tmp, ignore_errors=True)
        raise UsageError(f"the code under {REPO} changed while it was copied into the sweep: submit again")
    try:
        os.rename(tmp, target)  # fails, rather than replaces, when `target` appeared meanwhile (non-empty)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _entry(target, digest)
