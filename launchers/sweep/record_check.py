"""What a `sweep.json` must hold before anything acts on it: it is read back from disk, so another version,
another tool, a crash or a person may have written it.

Each run entry needs a run id that is a plain name, a `dir` inside the sweep directory, text `size` and
`variant`, an integer `seed` and a `config` mapping; each submission a mapping whose `jobs` map run ids to job
ids (text or null). `check` returns the record with what is usable and one line per thing it left out, naming
the file and the field; `rrtrain status` shows the rest, `rrtrain sweep` (which writes the record back) refuses.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

from rrtrain.rundir import fields

#: a run id: a plain name (no path separators, not `.` or `..`, no leading dash)
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=@,-]{0,254}")


def _inside(path: str, root: Path) -> bool:
    try:
        return Path(path).resolve().is_relative_to(root)
    except (OSError, ValueError, RuntimeError):  # a NUL byte, a symlink loop
        return False


def check_run(rid: Any, entry: Any, root: Path) -> Optional[str]:
    """Why run entry `rid` cannot be used (None: it can)."""
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
    if fields.step(entry.get("seed")) is None:
        return f"{where}.seed: not an integer (got {fields.short(entry.get('seed'))})"
    if not isinstance(entry.get("config"), dict):
        return f"{where}.config: not an object (got {type(entry.get('config')).__name__})"
    if not isinstance(entry.get("resources", {}), dict):
        return f"{where}.resources: not an object"
    return None


def check_submission(i: int, sub: Any) -> Optional[str]:
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
    return None


def check(data: dict[str, Any], out: Path) -> tuple[dict[str, Any], list[str]]:
    """(the record keeping only usable runs and submissions, one line per thing left out). `data` must be an
    object holding `runs` (the caller checks that: without it there is no record at all)."""
    root = Path(out).resolve()
    problems: list[str] = []
    clean = dict(data)
    runs = data.get("runs")
    if not isinstance(runs, dict):
        problems.append(f"runs: not an object (a {type(runs).__name__})")
        runs = {}
    clean["runs"] = {}
    for rid, entry in runs.items():
        why = check_run(rid, entry, root)
        if why is None:
            clean["runs"][rid] = entry
        else:
            problems.append(why)
    subs = data.get("submissions", [])
    if not isinstance(subs, list):
        problems.append(f"submissions: not a list (a {type(subs).__name__})")
        subs = []
    clean["submissions"] = []
    for i, sub in enumerate(subs):
        why = check_submission(i, sub)
        if why is None:
            clean["submissions"].append(sub)
        else:
            problems.append(why)
    if "cancellations" in data and not isinstance(data["cancellations"], list):
        problems.append("cancellations: not a list")
        clean["cancellations"] = []
    if "name" in data and not isinstance(data["name"], str):
        problems.append(f"name: not a name (got {fields.short(data['name'])})")
        clean.pop("name")
    code = data.get("code")
    if code is not None and not (isinstance(code, dict) and isinstance(code.get("path"), str)):
        problems.append("code: not an object with a text 'path'")
        clean.pop("code")
    elif code is not None and not _inside(code["path"], root):
        # runs import this snapshot first: one from elsewhere would be someone else's code
        problems.append(f"code.path: {fields.short(code['path'], 80)} is outside the sweep directory {root}")
        clean.pop("code")
    return clean, problems
