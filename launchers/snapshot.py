"""A copy of the code, taken once per sweep, that every run of the sweep imports first (PYTHONPATH), so
edits made after submission do not leak into queued or requeued runs."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("rrtrain", "data_prep", "launchers", "configs")


def code_hash(root: Path = REPO) -> str:
    h = hashlib.sha256()
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def take(out: Path, recorded: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The sweep's snapshot: the recorded one when it is still there; else `SWEEP_DIR/code` when it holds this
    very code; else a fresh copy (written aside, renamed) into `code`, or beside it into `code-HASH` when `code`
    holds other code. A snapshot is never deleted or replaced here: queued and running jobs import from it
    (the caller holds the sweep's lock, `launchers.sweep_lock`, so no other submission copies meanwhile)."""
    out = Path(out)
    if recorded and Path(recorded["path"]).is_dir():
        return recorded
    digest = code_hash()
    target = out / "code"
    if target.is_dir() and not target.is_symlink() and code_hash(target) == digest:
        return {"path": str(target.resolve()), "sha256": digest, "source": str(REPO)}
    if target.exists() or target.is_symlink():
        target = out / f"code-{digest[:12]}"  # `code` is another snapshot, perhaps in use: keep it
        if target.is_dir() and not target.is_symlink() and code_hash(target) == digest:
            return {"path": str(target.resolve()), "sha256": digest, "source": str(REPO)}
    for stale in out.glob(".code.tmp*"):  # a submission killed while copying (none runs now: we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=".code.tmp-", dir=out))
    tmp.chmod(0o755)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, tmp / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    try:
        os.rename(tmp, target)  # fails, rather than replaces, when `target` appeared meanwhile (non-empty)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"path": str(target.resolve()), "sha256": digest, "source": str(REPO)}
