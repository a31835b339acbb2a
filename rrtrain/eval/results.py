"""The result file of `rrtrain eval`, `RUN_DIR/eval/step_NNNNNNNN-KEY.json` (or in `--out DIR`: a run directory
someone else can write is not written into), and the table it prints.

The file (read by the report and the dashboard through rrtrain.rundir):
`{"step", "tasks", "num_fewshot", "limit", "source": "eval", "seconds", "lm_eval_version",
"results": {task: {metric: value, metric_stderr: value or null}}}`, non-finite numbers as null, written aside
and renamed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

from rrtrain.core.errors import UsageError
from rrtrain.core import files
from rrtrain.core.io import json_text
from rrtrain.rundir import layout


def result_path(run_dir: Path, step: int, key: str, out: Optional[str | Path] = None) -> Path:
    """Where the result file goes: `out/step_NNNNNNNN-KEY.json` (`--out`), else in `RUN_DIR/eval`."""
    return target_dir(run_dir, out) / f"step_{step:08d}-{key}.json"


def target_dir(run_dir: Path, out: Optional[str | Path] = None) -> Path:
    return Path(out) if out is not None else Path(run_dir) / layout.EVAL


def check_target(run_dir: Path, out: Optional[str | Path] = None) -> Path:
    """The directory the result goes to, refused in one line unless no one but the user (or root) can write it
    or a directory on its way: a run directory read as data (someone else's) is not written into. Checked
    before anything runs, and again when the file is written (`write`)."""
    where = target_dir(run_dir, out)
    why = files.private_path_problem(where)
    if why is None and (where.is_symlink() or where.exists()) and not where.is_dir():
        why = f"'{where}' {files.NOT_A_DIRECTORY}"  # the result's directory itself, a file: refused before the eval
    if why is not None:
        raise UsageError(_refusal(where, out is not None, why))
    return where


def _refusal(where: Path, given: bool, why: str) -> str:
    if given:
        return f"--out {str(where)!r}: {files.explained(why)}"
    if why.endswith(files.NOT_A_DIRECTORY):  # a wrong path, not a question of who can write it
        return f"{where}: {why} (RUN_DIR/eval, or the directory --out DIR names)"
    return (f"{where}: {why}; rrtrain eval writes its result into RUN_DIR/eval only when no one else can write "
            "there: choose a directory of your own with --out DIR")


def eval_dir(run_dir: Path, out: Optional[str | Path] = None) -> Path:
    """`RUN_DIR/eval` (or `out`), made when missing (the user's alone) and checked to be private once made; a link
    or anything but a directory there is refused (one line)."""
    path = target_dir(run_dir, out)
    why = files.prepare_private_dir(path)
    if why is not None:
        raise UsageError(_refusal(path, out is not None, why))
    if path.is_symlink() or not path.is_dir():
        raise UsageError(f"{path} is not a directory of this run (a link or a file): remove it")
    return path


def write(run_dir: Path, step: int, key: str, content: dict[str, Any], out: Optional[str | Path] = None) -> Path:
    """The result file, written aside and renamed in `RUN_DIR/eval` (or `out`, `--out`)."""
    eval_dir(run_dir, out)
    path = result_path(run_dir, step, key, out)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise UsageError(f"{path} is not a regular file: remove it")
    # beneath the run directory (or the directory --out names): eval/ and the file never through a link,
    # however they change meanwhile
    root, rel = (run_dir, f"{layout.EVAL}/{path.name}") if out is None else (out, path.name)
    try:
        files.atomic_write_beneath(root, rel, json_text(content).encode("utf-8"), make_parents=False)
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
