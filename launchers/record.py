"""`SWEEP_DIR/sweep.json`: what was asked (the sweep file's hash, each run's resolved config) and what was
done (per submission: when, how, which runs, their scheduler job ids). Written atomically.

Submitting a sweep again compares its runs with the recorded ones: a run whose resolved config changed is
refused with the differences; new runs (more sizes, more seeds) are added.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from launchers.expand import Run, config_diff
from launchers.spec import Sweep
from rrtrain.core.errors import UsageError
from rrtrain.core.io import atomic_write_json

NAME = "sweep.json"
VERSION = 1


def path(out: Path) -> Path:
    return Path(out) / NAME


def load(out: Path) -> Optional[dict[str, Any]]:
    p = path(out)
    if not p.exists():
        return None
    try:
        data = json.loads(p.read_text())
    except ValueError as err:
        raise UsageError(f"{p}: not valid JSON ({err})") from None
    if not isinstance(data, dict) or "runs" not in data:
        raise UsageError(f"{p}: not a sweep record (no 'runs')")
    return data


def save(out: Path, record: dict[str, Any]) -> None:
    atomic_write_json(path(out), record)


def run_entry(run: Run) -> dict[str, Any]:
    entry = {"size": run.size, "variant": run.variant, "seed": run.seed, "dir": str(run.dir),
             "config": run.config, "resources": asdict(run.resources)}
    if run.point:
        entry["point"] = dict(run.point)  # the grid point (also the config's run.point)
    return entry


def merge(record: Optional[dict[str, Any]], sweep: Sweep, runs: list[Run]) -> dict[str, Any]:
    """The record with this sweep's runs; refuses when an existing run's resolved config would change."""
    if record is None:
        record = {"version": VERSION, "name": sweep.spec.name, "runs": {}, "submissions": []}
    elif record.get("name") != sweep.spec.name:
        raise UsageError(f"this directory holds sweep '{record.get('name')}', not '{sweep.spec.name}': "
                         "use another --out")
    changed = []
    for run in runs:
        old = record["runs"].get(run.id)
        if old is not None:
            diff = config_diff(old["config"], run.config)
            if diff:
                changed.append(f"{run.id}: {'; '.join(diff)}")
    if changed:
        more = f" (and {len(changed) - 3} more runs)" if len(changed) > 3 else ""
        raise UsageError("the sweep file changed the config of runs already in this sweep, refusing: "
                         + " | ".join(changed[:3]) + more + "; use a new --out, or revert the change")
    out = dict(record)
    out["runs"] = dict(record["runs"])
    for run in runs:
        out["runs"].setdefault(run.id, run_entry(run))
    out["sweep_file"], out["sweep_sha256"] = str(sweep.path), sweep.sha256
    out["cancel_flagged"] = sweep.spec.monitor.cancel
    return out


def add_submission(record: dict[str, Any], executor: str, jobs: dict[str, Optional[str]]) -> None:
    record.setdefault("submissions", []).append(
        {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "executor": executor, "jobs": jobs,
         "sweep_sha256": record.get("sweep_sha256"), "code_sha256": record.get("code", {}).get("sha256")})


def last_jobs(record: dict[str, Any]) -> dict[str, tuple[str, Optional[str]]]:
    """Per run, (executor, job id) of its latest submission."""
    out: dict[str, tuple[str, Optional[str]]] = {}
    for sub in record.get("submissions", []):
        for rid, job in sub.get("jobs", {}).items():
            out[rid] = (sub.get("executor", ""), job)
    return out
