"""Find the runs under a sweep directory and read them, tolerating partial and corrupt files.

A run directory is any directory holding `final.json` or `metrics.jsonl` (DESIGN.md, "Command-line
contract"), at any depth. `final.json` is written once, when a run ends for any reason; a directory
with `metrics.jsonl` and no `final.json` is a run still going (or one that died without a word).

Nothing here decides what goes into a mean: `Run.category` only sorts runs into ok / flagged /
unfinished / unusable, and `rrtrain.report.analysis` applies `--include-flagged`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FLAGGED_STATUSES = frozenset({"stalled", "diverged", "failed"})
"""Statuses that mark a run as flagged: listed separately, kept out of means by default."""

UNFINISHED_STATUSES = frozenset({"preempted", "running"})
"""Statuses of runs that have not reached the end of their schedule; listed, never averaged."""

KNOWN_STATUSES = FLAGGED_STATUSES | UNFINISHED_STATUSES | {"completed"}

SKIP_DIRS = frozenset({"checkpoints", "tb", "__pycache__", ".git"})
"""Directory names never searched for runs (large, and never hold one)."""

TRAIN_KINDS = frozenset({"train"})
EVAL_KINDS = frozenset({"eval", "val"})


@dataclass
class Metrics:
    """The loss curves of one run, one value per step (the last one logged for a step wins)."""

    train_steps: np.ndarray
    train_loss: np.ndarray
    val_steps: np.ndarray
    val_loss: np.ndarray
    lines: int = 0
    bad_lines: int = 0
    relogged: int = 0

    @classmethod
    def empty(cls) -> "Metrics":
        z = np.zeros(0)
        return cls(z.astype(int), z, z.astype(int), z)


@dataclass
class Run:
    """One run directory, as read from disk."""

    path: Path
    rel: str
    variant: str | None = None
    size: str | None = None
    seed: int | str | None = None
    status: str = "unfinished"
    flags: tuple[str, ...] = ()
    has_final: bool = False
    params: float | None = None
    step: int | None = None
    tokens: int | None = None
    final_val_loss: float | None = None
    best_val_loss: float | None = None
    wall_s: float | None = None
    metrics: Metrics = field(default_factory=Metrics.empty)
    problems: list[str] = field(default_factory=list)

    @property
    def category(self) -> str:
        """`ok`, `flagged`, `unfinished` or `unusable`; see `reason` for why a run is not ok."""
        return self._classify()[0]

    @property
    def reason(self) -> str:
        return self._classify()[1]

    def _classify(self) -> tuple[str, str]:
        unreadable = [p for p in self.problems if p.startswith("final.json")]
        if unreadable:
            return "unusable", unreadable[0]
        if self.variant is None or self.size is None:
            return "unusable", "variant or size unknown (no readable final.json or config.yaml)"
        if not self.has_final:
            return "unfinished", "no final.json yet (running or unfinished)"
        if self.status in FLAGGED_STATUSES or self.flags:
            why = [f"status {self.status}"] if self.status in FLAGGED_STATUSES else []
            if self.flags:
                why.append("flags: " + ", ".join(self.flags))
            return "flagged", "; ".join(why)
        if self.status in UNFINISHED_STATUSES:
            return "unfinished", f"status {self.status}"
        if self.status not in KNOWN_STATUSES:
            return "unusable", f"unknown status {self.status!r}"
        if self.final_val_loss is None:
            return "unusable", "no final_val_loss"
        return "ok", ""

    @property
    def convex(self) -> bool:
        return is_convex(self.variant or "")


def is_convex(variant: str) -> bool:
    """Convex-gate variants (the residual registry's `convex` rules) are drawn dashed; a name the registry
    does not know (a run from another version) is not convex."""
    from rrtrain import residuals

    try:
        return residuals.get(variant).convex
    except KeyError:
        return False


def find_runs(sweep_dir: str | os.PathLike[str], skip: list[Path] | None = None) -> list[Run]:
    """Every run directory under `sweep_dir` (any depth), read and sorted by relative path.

    `skip` lists directories not to search (the report's own output directory).
    """
    root = Path(sweep_dir)
    return sorted((read_run(d, root) for d in run_dirs(root, skip)), key=lambda r: r.rel)


def run_dirs(sweep_dir: str | os.PathLike[str], skip: list[Path] | None = None) -> list[Path]:
    """Every directory under `sweep_dir` (any depth) holding `final.json` or `metrics.jsonl`, sorted."""
    root = Path(sweep_dir)
    skipped = {p.resolve() for p in (skip or [])}
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(
            d for d in dirnames if d not in SKIP_DIRS and (here / d).resolve() not in skipped
        )
        if "final.json" in filenames or "metrics.jsonl" in filenames:
            found.append(here)
    return sorted(found)


def read_run(run_dir: Path, root: Path) -> Run:
    """Read one run directory: final.json, then config.yaml for what final.json lacks, then metrics."""
    rel = run_dir.relative_to(root).as_posix() if run_dir != root else "."
    run = Run(path=run_dir, rel=rel)
    final = _read_final(run_dir / "final.json", run)
    config = _read_config(run_dir / "config.yaml", run) if final is None or not _has_identity(final) else {}
    if final is not None:
        run.has_final = True
        run.status = str(final.get("status") or "unknown")
        run.flags = tuple(str(f) for f in (final.get("flags") or []) if str(f))
        run.params = _number(final.get("params"))
        run.step = _integer(final.get("step"))
        run.tokens = _integer(final.get("tokens"))
        run.final_val_loss = _finite(final.get("final_val_loss"))
        run.best_val_loss = _finite(final.get("best_val_loss"))
        run.wall_s = _number(final.get("wall_s"))
    src = final or {}
    run.variant = _text(src.get("variant")) or _text(_dig(config, "model", "variant"))
    run.size = _text(src.get("size")) or _text(_dig(config, "model", "size"))
    seed = src.get("seed") if src.get("seed") is not None else _dig(config, "train", "seed")
    run.seed = _integer(seed) if _integer(seed) is not None else _text(seed)
    if (run_dir / "metrics.jsonl").is_file():
        run.metrics = read_metrics(run_dir / "metrics.jsonl")
        if run.metrics.bad_lines:
            run.problems.append(f"metrics.jsonl: {run.metrics.bad_lines} unreadable line(s) skipped")
    return run


def read_metrics(path: Path) -> Metrics:
    """Parse metrics.jsonl: training lines (`step`, `loss`) and evaluation lines (`step`, `val_loss`).

    Lines with another `kind` (e.g. `"diag"`) are ignored. Lines that are not JSON objects (a torn
    last line after a crash, garbage) are counted in `bad_lines` and skipped. A step logged twice (a
    resumed run re-logs the steps after its last checkpoint) keeps the last value; `relogged` counts
    the replaced values.
    """
    train: dict[int, float] = {}
    val: dict[int, float] = {}
    lines = bad = relogged = 0
    with open(path, "rb") as fh:
        for raw in fh:
            if not raw.strip():
                continue
            lines += 1
            try:
                rec = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                bad += 1
                continue
            if not isinstance(rec, dict):
                bad += 1
                continue
            kind = rec.get("kind")
            if kind is not None and kind not in TRAIN_KINDS | EVAL_KINDS:
                continue
            step = _integer(rec.get("step"))
            malformed = False
            for key, table in (("loss", train), ("val_loss", val)):
                value = rec.get(key)
                if value is None or (key == "loss" and kind in EVAL_KINDS):
                    continue
                if step is None or not _is_number(value):
                    malformed = True
                    continue
                relogged += step in table
                table[step] = float(value)
            bad += malformed
    ts = sorted(train)
    vs = sorted(val)
    return Metrics(
        train_steps=np.array(ts, dtype=np.int64),
        train_loss=np.array([train[s] for s in ts], dtype=float),
        val_steps=np.array(vs, dtype=np.int64),
        val_loss=np.array([val[s] for s in vs], dtype=float),
        lines=lines,
        bad_lines=bad,
        relogged=relogged,
    )


def _read_final(path: Path, run: Run) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as err:
        run.problems.append(f"final.json unreadable: {type(err).__name__}")
        return None
    if not isinstance(data, dict):
        run.problems.append("final.json unreadable: not a JSON object")
        return None
    return data


def _read_config(path: Path, run: Run) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        import yaml

        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except Exception as err:  # noqa: BLE001 - any YAML error only costs us the fallback identity
        run.problems.append(f"config.yaml unreadable: {type(err).__name__}")
        return {}
    return data if isinstance(data, dict) else {}


def _has_identity(final: dict[str, Any]) -> bool:
    return all(final.get(k) not in (None, "") for k in ("variant", "size", "seed"))


def _dig(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _number(v: Any) -> float | None:
    return float(v) if _is_number(v) else None


def _finite(v: Any) -> float | None:
    x = _number(v)
    return x if x is not None and math.isfinite(x) else None


def _integer(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        return int(v)
    return None


def _text(v: Any) -> str | None:
    return str(v) if v not in (None, "") and not isinstance(v, (dict, list)) else None
