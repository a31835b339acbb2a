"""Writes into a run directory. Each file is replaced atomically (written aside, renamed), so a reader finds
the old content or the new, never half of it. `metrics.jsonl` and TensorBoard: `rrtrain.rundir.metrics`;
`run.lock`: `rrtrain.rundir.lock`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from rrtrain.core import files
from rrtrain.core.io import atomic_write_json, atomic_write_text
from rrtrain.rundir import layout


def write_config(run_dir: str | os.PathLike[str], config: dict[str, Any]) -> None:
    """config.yaml: the resolved config, as the run trains with it."""
    import yaml

    atomic_write_text(Path(run_dir) / layout.CONFIG, yaml.safe_dump(config, sort_keys=False))


def write_parametrization(run_dir: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """parametrization.json: a mup/completep run's multipliers and optimizer groups, at the start."""
    atomic_write_json(Path(run_dir) / layout.PARAMETRIZATION, record)


def write_final(run_dir: str | os.PathLike[str], final: dict[str, Any]) -> Path:
    """final.json, once, when the run ends; raises OSError (a full disk) for the caller to report."""
    path = Path(run_dir) / layout.FINAL
    atomic_write_json(path, final)
    return path


def write_cancelled(run_dir: str | os.PathLike[str], reason: str, flags: list[str]) -> None:
    """cancelled.json, before the run is signalled: the run reads it to say why it ended."""
    atomic_write_json(Path(run_dir) / layout.CANCELLED, {"reason": reason, "flags": sorted(flags), "time": time.time()})


def write_pause(run_dir: str | os.PathLike[str], step: int, reason: str) -> None:
    """pause.json, before the run starts: it checkpoints and ends `paused` after optimizer step `step`."""
    files.make_dirs(run_dir)
    atomic_write_json(Path(run_dir) / layout.PAUSE, {"step": int(step), "reason": reason, "time": time.time()})


def clear_pause(run_dir: str | os.PathLike[str]) -> None:
    """No pause.json: the run trains to its end (a stale request must not pause a resubmitted run)."""
    files.remove_file(Path(run_dir, layout.PAUSE))  # the name only, never what a link there names
