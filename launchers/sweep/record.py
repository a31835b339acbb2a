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
from typing import Any, Callable, Optional

from launchers.sweep import record_check
from launchers.sweep.expand import Run, config_diff
from launchers.sweep.spec import Sweep
from rrtrain.core import untrusted
from rrtrain.core.errors import UsageError
from rrtrain.core.io import atomic_write_json

NAME = "sweep.json"
VERSION = 1


def path(out: Path) -> Path:
    return Path(out) / NAME


def load(out: Path, problems: Optional[list[str]] = None) -> Optional[dict[str, Any]]:
    """The sweep's record, None when there is none. A file that is no record at all is a UsageError; a run entry
    or submission that cannot be used (`launchers.sweep.record_check`) is one too, unless `problems` is given: then
    it is left out of the record returned and said there, one line each (`rrtrain status` shows the rest)."""
    p = path(out)
    try:
        raw = untrusted.read_bytes(p)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise UsageError(f"{p}: unreadable ({err.strerror or type(err).__name__})") from None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as err:
        raise UsageError(f"{p}: not valid JSON ({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None
    if not isinstance(data, dict) or "runs" not in data:
        raise UsageError(f"{p}: not a sweep record (no 'runs')")
    clean, found = record_check.check(data, Path(out))
    if found and problems is None:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UsageError(f"{p}: {found[0]}{more}; repair or move the file")
    if problems is not None:
        problems.extend(f"{NAME}: {line}" for line in found)
    return clean


def save(out: Path, record: dict[str, Any]) -> None:
    atomic_write_json(path(out), record)


def update(out: Path, change: Callable[[Optional[dict[str, Any]]], dict[str, Any]]) -> dict[str, Any]:
    """Read sweep.json, `change` it, write it back, all under the record's lock (`launchers.sweep.lock`): what
    another process recorded meanwhile (a cancellation, a submission) is in what `change` is given, never
    overwritten by an older copy. Returns what was written."""
    from launchers.sweep.lock import hold_record

    with hold_record(out):
        new = change(load(out))
        save(out, new)
    return new


def keep_cancellations(mine: dict[str, Any]) -> Callable[[Optional[dict[str, Any]]], dict[str, Any]]:
    """A `change` that writes `mine` with the cancellations recorded on disk (the one field another process
    adds while a submission holds the sweep lock)."""
    def change(current: Optional[dict[str, Any]]) -> dict[str, Any]:
        if current is not None and current.get("cancellations"):
            mine["cancellations"] = current["cancellations"]
        return mine
    return change


def record_submission(out: Path, mine: dict[str, Any], executor: str, jobs: dict[str, Optional[str]]) -> dict[str, Any]:
    """Add one submission to sweep.json as it is on disk now (else to `mine`), under the record's lock."""
    def change(current: Optional[dict[str, Any]]) -> dict[str, Any]:
        rec = current if current is not None else mine
        add_submission(rec, executor, jobs)
        return rec
    return update(out, change)


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
