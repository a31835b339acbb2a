"""A run's downstream-task results, from both places they are written: the in-loop records of metrics.jsonl
(`{"kind": "downstream", "step": N, "downstream/TASK/METRIC": value, ...}`) and the result files of `rrtrain eval`
(`eval/step_NNNNNNNN-KEY.json`, one per checkpoint step and task set, their `results` as `{TASK: {METRIC: value}}`).

`read_downstream(run_dir)` merges them into `{step: {"TASK/METRIC": value}}`: at the same step a result file's value
wins over a record's (the file is the evaluation a person asked for, with its own `--limit` and few-shot count),
of two result files the later in name order; a step logged twice in metrics.jsonl (a resumed run) keeps its last
value. Standard errors (`*_stderr`) and non-finite or null values are left out. `final(table)` gives a run's last
downstream values: those at the largest step that has any.

Everything here is untrusted: eval/ and its files may be links, FIFOs, huge or malformed. eval/ is opened without
following a link, each file too (relative to it), only regular files of at most MAX_FILE_BYTES are read, at most
MAX_FILES of them; a file that cannot be used costs one line in the caller's `problems`, never a traceback.
No torch here: `rrtrain report` and the dashboard load this module.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any, Iterable, Optional

from rrtrain.core import files
from rrtrain.rundir import fields, layout, readers

#: a downstream record's kind, and the prefix of its value keys
KIND = "downstream"
PREFIX = "downstream/"
#: `rrtrain eval`'s result files: step_{N:08d}-{key}.json
FILE_NAME = re.compile(r"step_([0-9]{8,19})-([A-Za-z0-9._,+=-]{1,200})\.json")
#: a result file is a few kB; one larger than this is not one rrtrain wrote
MAX_FILE_BYTES = files.LIMITS["json"]
#: the most result files read of one run (a checkpoint step per file and task set)
MAX_FILES = 10_000
#: a task or metric name becomes a TensorBoard tag, a markdown cell and a CSV column: a plain name only
TASK_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,199}")
METRIC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}(,[A-Za-z0-9][A-Za-z0-9_.+-]{0,63})?")
STDERR = "_stderr"

#: step -> {"TASK/METRIC": value}
Table = dict[int, dict[str, float]]


def metric_key(task: Any, metric: Any) -> Optional[str]:
    """"TASK/METRIC", or None when either is not a plain name or the metric is a standard error. A filtered
    metric keeps its filter, as `rrtrain eval` writes it (`exact_match.strict-match`) or as lm-eval does
    (`exact_match,strict-match`); lm-eval's default filter is dropped (`acc,none` is `acc`)."""
    if not isinstance(task, str) or not isinstance(metric, str):
        return None
    if metric.endswith(",none"):
        metric = metric[: -len(",none")]
    if metric.partition(",")[0].endswith(STDERR) or not TASK_NAME.fullmatch(task) or not METRIC_NAME.fullmatch(metric):
        return None
    return f"{task}/{metric}"


def split_key(key: str) -> tuple[str, str]:
    """"TASK/METRIC" -> (TASK, METRIC) (a metric name has no slash)."""
    task, _, metric = key.rpartition("/")
    return task, metric


def record_values(rec: dict[str, Any]) -> Optional[tuple[int, dict[str, float]]]:
    """A metrics.jsonl record's (step, {"TASK/METRIC": value}) when it is a downstream record with a whole-number
    step; None otherwise. Keys that are not `downstream/TASK/METRIC` with a finite number are left out."""
    if rec.get("kind") != KIND:
        return None
    step = fields.step(rec.get("step"))
    if step is None or step < 0:
        return None
    values: dict[str, float] = {}
    for name, value in rec.items():
        if not isinstance(name, str) or not name.startswith(PREFIX):
            continue
        task, _, metric = name[len(PREFIX):].rpartition("/")
        key = metric_key(task, metric)
        x = fields.finite(value)
        if key is not None and x is not None:
            values[key] = x
    return step, values


def take_record(rec: dict[str, Any], into: Table) -> bool:
    """Add a downstream record's values to `into` (a later record of a step wins); False when `rec` is not one."""
    got = record_values(rec)
    if got is None:
        return False
    step, values = got
    if values:
        into.setdefault(step, {}).update(values)
    return True


def read_records(run_dir: str | os.PathLike[str]) -> Table:
    """The in-loop downstream values of metrics.jsonl (streamed; unreadable lines skipped)."""
    table: Table = {}
    for rec in readers.records(readers.metrics_path(run_dir)):
        if rec is not None:
            take_record(rec, table)
    return table


def parse_result(data: dict[str, Any], step: int, name: str, problems: Optional[list[str]] = None
                 ) -> Optional[dict[str, float]]:
    """A result file's {"TASK/METRIC": value}; None (and a line in `problems`) when the object is not a result
    of that step."""
    where = f"{layout.EVAL}/{name}"
    recorded = fields.step(data.get("step"))
    if recorded != step:
        return _refuse(problems, f"{where} unreadable: its 'step' ({fields.short(data.get('step'))}) is not the "
                                 f"step of its name ({step})")
    results = data.get("results")
    if not isinstance(results, dict):
        return _refuse(problems, f"{where} unreadable: 'results' is not an object")
    values: dict[str, float] = {}
    for task, metrics in results.items():
        if not isinstance(metrics, dict):
            continue
        for metric, value in metrics.items():
            key = metric_key(task, metric)
            x = fields.finite(value)
            if key is not None and x is not None:
                values[key] = x
    return values


def read_eval_dir(run_dir: str | os.PathLike[str], problems: Optional[list[str]] = None) -> Table:
    """The values of every result file in the run's eval/ (none when it has no eval/). eval/ itself must be a
    directory, not a link; each file a regular file, not a link; bad ones are skipped, one line each."""
    table: Table = {}
    path = Path(run_dir) / layout.EVAL
    try:
        dfd = files.open_beneath(run_dir, layout.EVAL, directory=True)
    except FileNotFoundError:
        return table
    except OSError as err:  # a link to a directory is ENOTDIR here, to anything else ELOOP
        why = "a link (not followed)" if err.errno == errno.ELOOP or path.is_symlink() else (
            "not a directory" if err.errno == errno.ENOTDIR else err.strerror or type(err).__name__)
        _refuse(problems, f"{layout.EVAL}/ unreadable: {why}")
        return table
    try:
        names = sorted(n for n in os.listdir(dfd) if FILE_NAME.fullmatch(n))
        if len(names) > MAX_FILES:
            _refuse(problems, f"{layout.EVAL}/: {len(names)} result files; read the first {MAX_FILES} by name")
            names = names[:MAX_FILES]
        for name in names:
            step = int(FILE_NAME.fullmatch(name).group(1))  # type: ignore[union-attr]
            data = _read_object(dfd, name, problems)
            values = None if data is None else parse_result(data, step, name, problems)
            if values:
                table.setdefault(step, {}).update(values)  # names sorted: the later file wins
    except OSError as err:
        _refuse(problems, f"{layout.EVAL}/ unreadable: {err.strerror or type(err).__name__}")
    finally:
        os.close(dfd)
    return table


def _read_object(dfd: int, name: str, problems: Optional[list[str]]) -> Optional[dict[str, Any]]:
    """The JSON object in eval/NAME, opened relative to eval/'s descriptor without following a link, non-blocking
    (a FIFO), only when it is a regular file, and at most MAX_FILE_BYTES of it."""
    where = f"{layout.EVAL}/{name}"
    try:
        raw = files.read_beneath(dfd, name, MAX_FILE_BYTES)
    except OSError as err:  # a link (LinkRefused), not a regular file, larger than MAX_FILE_BYTES
        why = "a link (not followed)" if err.errno == errno.ELOOP else err.strerror or type(err).__name__
        return _refuse(problems, f"{where} unreadable: {why}")
    return readers.parse_json_object(raw, where, problems)


def merge(records: Table, files: Table) -> Table:
    """Both sources in one table: at a step, a result file's value wins over a record's for the same key."""
    out: Table = {step: dict(values) for step, values in records.items()}
    for step, values in files.items():
        out.setdefault(step, {}).update(values)
    return {step: out[step] for step in sorted(out) if out[step]}


def read_downstream(run_dir: str | os.PathLike[str], problems: Optional[list[str]] = None) -> Table:
    """step -> {"TASK/METRIC": value} of the run, from metrics.jsonl and eval/ (see the module docstring)."""
    return merge(read_records(run_dir), read_eval_dir(run_dir, problems))


def final(table: Table) -> tuple[Optional[int], dict[str, float]]:
    """The run's final downstream values: (the largest step that has any, its values); (None, {}) for none."""
    steps = [s for s, values in table.items() if values]
    if not steps:
        return None, {}
    last = max(steps)
    return last, dict(table[last])


def keep_last(table: Table) -> None:
    """Drop every step but the largest from `table` (a reader that wants only `final` keeps memory bounded)."""
    if len(table) > 1:
        last = max(table)
        for step in [s for s in table if s != last]:
            del table[step]


def tasks(keys: Iterable[str]) -> dict[str, list[str]]:
    """{TASK: [METRIC, ...]} of "TASK/METRIC" keys, both sorted."""
    out: dict[str, set[str]] = {}
    for key in keys:
        task, metric = split_key(key)
        out.setdefault(task, set()).add(metric)
    return {t: sorted(m) for t, m in sorted(out.items())}


def _refuse(problems: Optional[list[str]], line: str) -> None:
    if problems is not None:
        problems.append(line)
    return None

