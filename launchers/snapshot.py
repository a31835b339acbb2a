"""A copy of the code, taken once per sweep, that every run of the sweep imports first (PYTHONPATH), so
edits made after submission do not leak into queued or requeued runs."""

from __future__ import annotations

import hashlib
import shutil
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
    """The sweep's snapshot: the recorded one when it is still there, else a fresh copy (written aside, renamed)."""
    target = Path(out) / "code"
    if recorded and Path(recorded["path"]).is_dir():
        return recorded
    digest = code_hash()
    tmp = Path(out) / ".code.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, tmp / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return {"path": str(target.resolve()), "sha256": digest, "source": str(REPO)}
