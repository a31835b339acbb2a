"""`SWEEP_DIR/sweep.json`: what was asked (the sweep file's hash, each run's resolved config) and what was
done (per submission: when, how, which runs, their scheduler job ids), as one typed `SweepRecord`, read and
written here only. Written atomically.

It is read back from disk, so another version, another tool, a crash or a person may have written it: `parse`
builds the record from what is usable, and says one line per thing it left out, naming the field. Each run
entry needs a run id that is a plain name, a `dir` inside the sweep directory, text `size` and `variant`, an
integer `seed` and a `config` mapping; each submission a mapping whose `jobs` map run ids to job ids (text or
null); the code snapshot a text `path` inside the sweep directory. `rrtrain status` shows the rest; `rrtrain
sweep` (which writes the record back) refuses.

Submitting a sweep again compares its runs with the recorded ones: a run whose resolved config changed is
refused with the differences; new runs (more sizes, more seeds) are added.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from launchers.sweep.expand import Run, config_diff
from launchers.sweep.spec import Sweep
from rrtrain.core import files
from rrtrain.core.errors import UsageError
from rrtrain.core.io import atomic_write_json
from rrtrain.rundir import fields

NAME = "sweep.json"
VERSION = 1
#: a run id: a plain name (no path separators, not `.` or `..`, no leading dash)
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=@,-]{0,254}")


@dataclass
class RunEntry:
    """One run of the sweep as submitted: its place on the axes, its directory, its resolved config."""

    size: str
    variant: str
    seed: int
    dir: str
    config: dict[str, Any]
    resources: dict[str, Any] = field(default_factory=dict)
    point: Optional[dict[str, Any]] = None  # the grid point (also the config's run.point)

    @classmethod
    def of_run(cls, run: Run) -> "RunEntry":
        return cls(run.size, run.variant, run.seed, str(run.dir), run.config, asdict(run.resources),
                   dict(run.point) if run.point else None)

    def to_json(self) -> dict[str, Any]:
        out = {"size": self.size, "variant": self.variant, "seed": self.seed, "dir": self.dir,
               "config": self.config, "resources": self.resources}
        if self.point:
            out["point"] = self.point
        return out


@dataclass
class Submission:
    """One submission: when, by which executor, and the job id it got for each run (None: none, e.g. local)."""

    executor: str = ""
    jobs: dict[str, Optional[str]] = field(default_factory=dict)
    time: Optional[str] = None
    sweep_sha256: Optional[str] = None
    code_sha256: Optional[str] = None

    def to_json(self) -> dict[str, Any]:
        return {"time": self.time, "executor": self.executor, "jobs": self.jobs, "sweep_sha256": self.sweep_sha256,
                "code_sha256": self.code_sha256}


@dataclass
class SweepRecord:
    name: str
    runs: dict[str, RunEntry] = field(default_factory=dict)
    submissions: list[Submission] = field(default_factory=list)
    version: int = VERSION
    sweep_file: Optional[str] = None
    sweep_sha256: Optional[str] = None
    cancel_flagged: Any = None  # the sweep file's `monitor.cancel`
    code: Optional[dict[str, Any]] = None  # the code snapshot (launchers.sweep.snapshot): path, sha256, hash kind
    cancellations: list[dict[str, Any]] = field(default_factory=list)  # what `--cancel-flagged` stopped, and why
    other: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, kept as they were

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.other, "version": self.version, "name": self.name,
                               "runs": {rid: e.to_json() for rid, e in self.runs.items()},
                               "submissions": [s.to_json() for s in self.submissions]}
        for key in ("sweep_file", "sweep_sha256", "cancel_flagged", "code"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.cancellations:
            out["cancellations"] = self.cancellations
        return out

    def last_jobs(self) -> dict[str, tuple[str, Optional[str]]]:
        """Per run, (executor, job id) of its latest submission."""
        out: dict[str, tuple[str, Optional[str]]] = {}
        for sub in self.submissions:
            for rid, job in sub.jobs.items():
                out[rid] = (sub.executor, job)
        return out


def path(out: Path) -> Path:
    return Path(out) / NAME


def _inside(p: str, root: Path) -> bool:
    try:
        return Path(p).resolve().is_relative_to(root)
    except (OSError, ValueError, RuntimeError):  # a NUL byte, a symlink loop
        return False


def relative_dir(d: str, out: Path) -> Optional[str]:
    """A recorded run directory `d` as a path below the sweep directory `out`, read from the text alone (under
    `out` as given or as it resolves: a record written under another name of the same directory), never by
    resolving `d`; None when it names no place below `out`. What acts on a run (`launchers.cancel`) opens this
    from `out`'s descriptor with no link followed on the way (`files.open_beneath`), once: `_inside` resolved
    `d` when the record was read, and a link on its way may lead elsewhere by now."""
    try:
        place = os.path.normpath(os.path.abspath(d))
        roots = dict.fromkeys([os.path.abspath(out), os.path.realpath(out)])
    except (OSError, ValueError):  # a NUL byte
        return None
    for root in roots:
        rel = os.path.relpath(place, root)
        if rel != "." and rel != ".." and not rel.startswith(".." + os.sep):
            return rel
    return None


def _run(rid: Any, entry: Any, root: Path) -> RunEntry | str:
    """Run entry `rid` as a RunEntry, or why it cannot be used."""
    where = f"runs.{fields.short(rid)}"
    if not isinstance(rid, str) or not RUN_ID.fullmatch(rid):
        return f"{where}: the run id is not a plain name"
    if not isinstance(entry, dict):
        return f"{where}: not an object (a {type(entry).__name__})"
    d = entry.get("dir")
    if not isinstance(d, str) or not d or "\0" in d:
        return f"{where}.dir: not a path (got {fields.short(d)})"
    if not _inside(d, root):
        return f"{where}.dir: {fields.short(d, 80)} is outside the sweep directory {root} (was it moved?)"
    for key in ("size", "variant"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            return f"{where}.{key}: not a name (got {fields.short(entry.get(key))})"
    seed = fields.step(entry.get("seed"))
    if seed is None:
        return f"{where}.seed: not an integer (got {fields.short(entry.get('seed'))})"
    if not isinstance(entry.get("config"), dict):
        return f"{where}.config: not an object (got {type(entry.get('config')).__name__})"
    if not isinstance(entry.get("resources", {}), dict):
        return f"{where}.resources: not an object"
    point = entry.get("point")
    return RunEntry(entry["size"], entry["variant"], seed, d, entry["config"], entry.get("resources", {}),
                    point if isinstance(point, dict) and point else None)


def _submission(i: int, sub: Any) -> Submission | str:
    where = f"submissions[{i}]"
    if not isinstance(sub, dict):
        return f"{where}: not an object (a {type(sub).__name__})"
    if not isinstance(sub.get("executor", ""), str):
        return f"{where}.executor: not a name"
    jobs = sub.get("jobs", {})
    if not isinstance(jobs, dict):
        return f"{where}.jobs: not an object (a {type(jobs).__name__})"
    for rid, job in jobs.items():
        if job is not None and not isinstance(job, str):
            return f"{where}.jobs.{fields.short(rid)}: not a job id (got {fields.short(job)})"
    text = {k: sub.get(k) if isinstance(sub.get(k), str) else None for k in ("time", "sweep_sha256", "code_sha256")}
    return Submission(sub.get("executor", ""), dict(jobs), **text)


KNOWN = {"version", "name", "runs", "submissions", "sweep_file", "sweep_sha256", "cancel_flagged", "code",
         "cancellations"}


def parse(data: dict[str, Any], out: Path) -> tuple[SweepRecord, list[str]]:
    """(the record of what `data` holds that is usable, one line per thing left out). `data` must be an object
    holding `runs` (the caller checks that: without it there is no record at all)."""
    root = Path(out).resolve()
    problems: list[str] = []
    runs = data.get("runs")
    if not isinstance(runs, dict):
        problems.append(f"runs: not an object (a {type(runs).__name__})")
        runs = {}
    entries: dict[str, RunEntry] = {}
    for rid, entry in runs.items():
        got = _run(rid, entry, root)
        if isinstance(got, str):
            problems.append(got)
        else:
            entries[rid] = got
    subs = data.get("submissions", [])
    if not isinstance(subs, list):
        problems.append(f"submissions: not a list (a {type(subs).__name__})")
        subs = []
    submissions = []
    for i, sub in enumerate(subs):
        got = _submission(i, sub)
        if isinstance(got, str):
            problems.append(got)
        else:
            submissions.append(got)
    cancellations = data.get("cancellations", [])
    if not isinstance(cancellations, list):
        problems.append("cancellations: not a list")
        cancellations = []
    name = data.get("name", "")
    if not isinstance(name, str):
        problems.append(f"name: not a name (got {fields.short(name)})")
        name = ""
    code = data.get("code")
    if code is not None and not (isinstance(code, dict) and isinstance(code.get("path"), str)):
        problems.append("code: not an object with a text 'path'")
        code = None
    elif code is not None and not _inside(code["path"], root):
        # runs import this snapshot first: one from elsewhere would be someone else's code
        problems.append(f"code.path: {fields.short(code['path'], 80)} is outside the sweep directory {root}")
        code = None
    text = {k: data.get(k) if isinstance(data.get(k), str) else None for k in ("sweep_file", "sweep_sha256")}
    version = data.get("version") if fields.step(data.get("version")) is not None else VERSION
    rec = SweepRecord(name, entries, submissions, version, cancel_flagged=data.get("cancel_flagged"), code=code,
                      cancellations=[c for c in cancellations if isinstance(c, dict)],
                      other={k: v for k, v in data.items() if k not in KNOWN}, **text)
    return rec, problems


def load(out: Path, problems: Optional[list[str]] = None) -> Optional[SweepRecord]:
    """The sweep's record, None when there is none. A file that is no record at all is a UsageError; a run entry
    or submission that cannot be used (`parse`) is one too, unless `problems` is given: then it is left out of the
    record returned and said there, one line each (`rrtrain status` shows the rest)."""
    p = path(out)
    try:
        raw = files.read_bytes(p)
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
    rec, found = parse(data, Path(out))
    if found and problems is None:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UsageError(f"{p}: {found[0]}{more}; repair or move the file")
    if problems is not None:
        problems.extend(f"{NAME}: {line}" for line in found)
    return rec


def save(out: Path, record: SweepRecord) -> None:
    atomic_write_json(path(out), record.to_json())


def update(out: Path, change: Callable[[Optional[SweepRecord]], SweepRecord]) -> SweepRecord:
    """Read sweep.json, `change` it, write it back, all under the record's lock (`launchers.sweep.lock`): what
    another process recorded meanwhile (a cancellation, a submission) is in what `change` is given, never
    overwritten by an older copy. Returns what was written."""
    from launchers.sweep.lock import hold_record

    with hold_record(out):
        new = change(load(out))
        save(out, new)
    return new


def keep_cancellations(mine: SweepRecord) -> Callable[[Optional[SweepRecord]], SweepRecord]:
    """A `change` that writes `mine` with the cancellations recorded on disk (the one field another process
    adds while a submission holds the sweep lock)."""
    def change(current: Optional[SweepRecord]) -> SweepRecord:
        if current is not None and current.cancellations:
            mine.cancellations = current.cancellations
        return mine
    return change


def record_submission(out: Path, mine: SweepRecord, executor: str, jobs: dict[str, Optional[str]]) -> SweepRecord:
    """Add one submission to sweep.json as it is on disk now (else to `mine`), under the record's lock."""
    def change(current: Optional[SweepRecord]) -> SweepRecord:
        rec = current if current is not None else mine
        add_submission(rec, executor, jobs)
        return rec
    return update(out, change)


def merge(record: Optional[SweepRecord], sweep: Sweep, runs: list[Run]) -> SweepRecord:
    """The record with this sweep's runs; refuses when an existing run's resolved config would change."""
    if record is None:
        record = SweepRecord(sweep.spec.name)
    elif record.name != sweep.spec.name:
        raise UsageError(f"this directory holds sweep '{record.name}', not '{sweep.spec.name}': use another --out")
    changed = []
    for run in runs:
        old = record.runs.get(run.id)
        if old is not None:
            diff = config_diff(old.config, run.config)
            if diff:
                changed.append(f"{run.id}: {'; '.join(diff)}")
    if changed:
        more = f" (and {len(changed) - 3} more runs)" if len(changed) > 3 else ""
        raise UsageError("the sweep file changed the config of runs already in this sweep, refusing: "
                         + " | ".join(changed[:3]) + more + "; use a new --out, or revert the change")
    runs_now = dict(record.runs)
    for run in runs:
        runs_now.setdefault(run.id, RunEntry.of_run(run))
    return SweepRecord(record.name, runs_now, list(record.submissions), record.version, str(sweep.path),
                       sweep.sha256, sweep.spec.monitor.cancel, record.code, list(record.cancellations),
                       dict(record.other))


def add_submission(record: SweepRecord, executor: str, jobs: dict[str, Optional[str]]) -> None:
    record.submissions.append(Submission(executor, jobs, time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                         record.sweep_sha256, (record.code or {}).get("sha256")))
