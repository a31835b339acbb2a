"""The result file of `rrtrain eval`, `RUN_DIR/eval/step_NNNNNNNN-KEY.json`, and the table it prints.

The file (read by the report and the dashboard through rrtrain.rundir):
`{"step", "tasks", "num_fewshot", "limit", "source": "eval", "seconds", "lm_eval_version",
"results": {task: {metric: value, metric_stderr: value or null}}}`, non-finite numbers as null, written aside
and renamed.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Optional

from rrtrain.core.errors import UsageError
from rrtrain.core import files
from rrtrain.core.io import json_text
from rrtrain.rundir import layout


def result_path(run_dir: Path, step: int, key: str) -> Path:
    return Path(run_dir) / layout.EVAL / f"step_{step:08d}-{key}.json"


def eval_dir(run_dir: Path) -> Path:
    """`RUN_DIR/eval`, made when missing; a link or anything but a directory there is refused (one line)."""
    path = Path(run_dir) / layout.EVAL
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except OSError as err:
        raise UsageError(f"cannot create {path}: {err.strerror or err}") from None
    if path.is_symlink() or not path.is_dir():
        raise UsageError(f"{path} is not a directory of this run (a link or a file): remove it")
    return path


def write(run_dir: Path, step: int, key: str, content: dict[str, Any]) -> Path:
    eval_dir(run_dir)
    path = result_path(run_dir, step, key)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise UsageError(f"{path} is not a regular file: remove it")
    try:  # beneath the run directory: eval/ and the file never through a link, however they change meanwhile
        files.atomic_write_beneath(run_dir, f"{layout.EVAL}/{path.name}", json_text(content).encode("utf-8"),
                                   make_parents=False)
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror or err}") from None
    return path


def content(step: int, tasks: list[str], num_fewshot: Optional[int], limit: Optional[int], seconds: float,
            version: str, results: dict[str, dict[str, Optional[float]]]) -> dict[str, Any]:
    return {"step": step, "tasks": sorted(tasks), "num_fewshot": num_fewshot, "limit": limit, "source": "eval",
            "seconds": round(seconds, 3), "lm_eval_version": version, "results": results}


def table(results: dict[str, dict[str, Optional[float]]]) -> str:
    """task | metric | value | stderr, values to lm-eval's printed precision (4 decimals)."""

    def num(v: Optional[float]) -> str:
        return "N/A" if v is None or not math.isfinite(v) else f"{v:.4f}"

    rows = [("task", "metric", "value", "stderr")]
    for task in sorted(results):
        metrics = results[task]
        for name in sorted(k for k in metrics if not k.endswith("_stderr")):
            rows.append((task, name, num(metrics[name]), num(metrics.get(f"{name}_stderr"))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
