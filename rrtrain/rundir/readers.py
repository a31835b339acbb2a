"""Typed readers of a run directory's files, for every consumer (report, status, sweep flags, cancel, dashboard,
the Slurm entry point, the trainer's own ending).

What they read is untrusted: another rrtrain version, another tool, a crash mid-write or a person may have
written it. A file that cannot be used at all (truncated JSON, a list where an object belongs) is refused with
one line naming the file, appended to the caller's `problems`; a field of the wrong type costs that field
(None, and a line in `Final.problems`); a metrics line that is not a JSON object is skipped. Never a traceback.
No torch here: `rrtrain status` loads these readers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from rrtrain.core import files
from rrtrain.rundir import fields, layout

#: by default `read_tail` parses training, evaluation and flag lines only: the long diagnostic lines are skipped
TRAIN_EVAL_FLAG = (b'"loss"', b'"flag"')
#: `latest_records` reads the end of metrics.jsonl, growing from TAIL_START until it has what it wants
TAIL_START, TAIL_MAX = 64 * 1024, 4 * 1024 * 1024
#: a metrics line longer than this is not one rrtrain wrote (a diagnostic line of a deep model is a few kB)
MAX_LINE_BYTES = files.MAX_LINE_BYTES


# -- whole files --------------------------------------------------------------------------------


def read_json_object(path: Path, name: Optional[str] = None,
                     problems: Optional[list[str]] = None) -> Optional[dict[str, Any]]:
    """The JSON object in `path`; None when it is missing, or unreadable (said in `problems`, the file called
    `name`, by default its file name)."""
    name = name or path.name
    try:
        raw = files.read_bytes(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        return _refuse(problems, f"{name} unreadable: {err.strerror or type(err).__name__}")
    return parse_json_object(raw, name, problems)


def parse_json_object(raw: bytes, name: str, problems: Optional[list[str]] = None) -> Optional[dict[str, Any]]:
    """The JSON object in `raw` (the bytes of the file called `name`); None when it is not one (said in
    `problems`)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as err:
        return _refuse(problems, f"{name} unreadable: {type(err).__name__} (truncated or not JSON)")
    if not isinstance(data, dict):
        return _refuse(problems, f"{name} unreadable: not a JSON object (a {type(data).__name__})")
    return data


def _refuse(problems: Optional[list[str]], line: str) -> None:
    if problems is not None:
        problems.append(line)
    return None


@dataclass(frozen=True)
class Final:
    """`final.json` as read: every field typed, None (or empty) where it is missing or of the wrong type; each
    wrong type is one line in `problems`. `raw` is the whole object, for fields no reader here names."""

    status: Optional[str] = None
    reason: str = ""
    signal: Optional[str] = None
    step: Optional[int] = None
    tokens: Optional[int] = None
    final_val_loss: Optional[float] = None  # finite, or None
    best_val_loss: Optional[float] = None
    params: Optional[float] = None
    wall_s: Optional[float] = None
    variant: Optional[str] = None
    size: Optional[str] = None
    seed: int | str | None = None
    flags: tuple[str, ...] = ()
    flag_details: dict[str, str] = field(default_factory=dict)
    exit_code: Optional[int] = None
    problems: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def _typed(data: dict[str, Any], key: str, read: Any, kind: str, problems: list[str]) -> Any:
    """`read(data[key])`; a value present but not of `kind` is None and one line in `problems`."""
    value = data.get(key)
    out = read(value)
    if value is not None and out is None:
        problems.append(f"{layout.FINAL}: field {key!r} is not {kind} (got {type(value).__name__} {fields.short(value)})")
    return out


def _loss(data: dict[str, Any], key: str, problems: list[str]) -> Optional[float]:
    """A loss field: None when missing, null or not finite (a run that never evaluated, or diverged: rrtrain
    writes those); a line in `problems` when it is a number no cross-entropy can be, or not a number."""
    value = data.get(key)
    if value is None or (fields.is_number(value) and fields.finite(value) is None):
        return None
    out = fields.loss(value)
    if out is None:
        problems.append(f"{layout.FINAL}: field {key!r} is not a loss (got {type(value).__name__} {fields.short(value)})")
    return out


def parse_final(data: dict[str, Any]) -> Final:
    """A final.json object, typed (see `Final`)."""
    p: list[str] = []
    seed = data.get("seed")
    for key, kind in (("flags", list), ("flag_details", dict)):
        if data.get(key) is not None and not isinstance(data.get(key), kind):
            p.append(f"{layout.FINAL}: field {key!r} is not a{'n object' if kind is dict else ' list'} "
                     f"(got {type(data[key]).__name__})")
    return Final(
        status=_typed(data, "status", fields.text, "a name", p),
        reason=fields.text(data.get("reason")) or "",
        signal=fields.text(data.get("signal")),
        step=_typed(data, "step", fields.count, "a step count", p),
        tokens=_typed(data, "tokens", fields.count, "a token count", p),
        final_val_loss=_loss(data, "final_val_loss", p),
        best_val_loss=_loss(data, "best_val_loss", p),
        params=_typed(data, "params", lambda v: fields.bounded(v, 0, fields.COUNT_MAX), "a parameter count", p),
        wall_s=_typed(data, "wall_s", lambda v: fields.bounded(v, 0, 1e12), "a number of seconds", p),
        variant=_typed(data, "variant", fields.text, "a name", p),
        size=_typed(data, "size", fields.text, "a name", p),
        seed=fields.integer(seed) if fields.integer(seed) is not None else fields.text(seed),
        flags=fields.texts(data.get("flags")),
        flag_details=fields.text_map(data.get("flag_details")),
        exit_code=fields.integer(data.get("exit_code")),
        problems=tuple(p), raw=data)


def read_final(run_dir: str | os.PathLike[str], problems: Optional[list[str]] = None) -> Optional[Final]:
    """The run's final.json; None when it has none (still going, or killed hard) or it is unreadable (said in
    `problems`)."""
    data = read_json_object(Path(run_dir) / layout.FINAL, layout.FINAL, problems)
    return None if data is None else parse_final(data)


def read_config(run_dir: str | os.PathLike[str], problems: Optional[list[str]] = None) -> dict[str, Any]:
    """The run's resolved config.yaml as plain data; {} when it has none or it is unreadable (said in
    `problems`). A section of the wrong type is the caller's to skip (`fields.dig`)."""
    path = Path(run_dir) / layout.CONFIG
    try:
        body = files.read_bytes(path).decode("utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as err:
        _refuse(problems, f"{layout.CONFIG} unreadable: {getattr(err, 'strerror', None) or type(err).__name__}")
        return {}
    import yaml  # only the readers that need the config pay for yaml

    try:
        data = files.load_yaml(body)  # aliases and nesting bounded
    except (yaml.YAMLError, ValueError, RecursionError) as err:
        _refuse(problems, f"{layout.CONFIG} unreadable: {type(err).__name__}")
        return {}
    if data is not None and not isinstance(data, dict):
        _refuse(problems, f"{layout.CONFIG} unreadable: not a mapping (a {type(data).__name__})")
    return data if isinstance(data, dict) else {}


@dataclass(frozen=True)
class Cancelled:
    """`cancelled.json`: `rrtrain sweep --cancel-flagged` stopped this run, for `reason` (the flags that did it)."""

    reason: str
    flags: tuple[str, ...] = ()
    time: Optional[float] = None


def read_cancelled(run_dir: str | os.PathLike[str]) -> Optional[Cancelled]:
    """The run's cancellation, or None when it was not cancelled. A marker that exists but cannot be read still
    cancels (the Slurm batch scripts look only at whether it exists): its reason says so."""
    problems: list[str] = []
    data = read_json_object(Path(run_dir) / layout.CANCELLED, layout.CANCELLED, problems)
    if data is None:
        return Cancelled(reason=problems[0]) if problems else None
    return Cancelled(reason=fields.text(data.get("reason")) or "", flags=fields.texts(data.get("flags")),
                     time=fields.number(data.get("time")))


@dataclass(frozen=True)
class Pause:
    """`pause.json`: end the run `paused` (checkpointed) after optimizer step `step`, for `reason`."""

    step: int
    reason: str = ""


def read_pause(run_dir: str | os.PathLike[str], problems: Optional[list[str]] = None) -> Optional[Pause]:
    """The run's pause request, or None (no file; or unusable: said in `problems`)."""
    data = read_json_object(Path(run_dir) / layout.PAUSE, layout.PAUSE, problems)
    if data is None:
        return None
    step = fields.integer(data.get("step"))
    if step is None or step < 1:
        return _refuse(problems, f"{layout.PAUSE} unreadable: 'step' is not a positive integer "
                                 f"(got {data.get('step')!r:.40})")
    return Pause(step=step, reason=fields.text(data.get("reason")) or "")


# -- who the run is ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Identity:
    variant: Optional[str]
    size: Optional[str]
    seed: int | str | None


def has_identity(final: Optional[Final]) -> bool:
    """Whether final.json alone names the run (then config.yaml need not be read)."""
    return final is not None and None not in (final.variant, final.size, final.seed)


def identity(final: Optional[Final], config: dict[str, Any]) -> Identity:
    """variant, size and seed: final.json's, else the resolved config's."""
    f = final or Final()
    seed = f.seed if f.seed is not None else fields.dig(config, "train", "seed")
    return Identity(variant=f.variant or fields.text(fields.dig(config, "model", "variant")),
                    size=f.size or fields.text(fields.dig(config, "model", "size")),
                    seed=fields.integer(seed) if fields.integer(seed) is not None else fields.text(seed))


# -- metrics.jsonl -------------------------------------------------------------------------------


def metrics_path(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / layout.METRICS


def records(path: Path, max_line: int = MAX_LINE_BYTES) -> Iterator[Optional[dict[str, Any]]]:
    """Every non-empty line of a metrics.jsonl, streamed (the file may be hundreds of MB): the JSON object, or
    None for a line that is not one (a torn last line, garbage, a list, a string, a line over `max_line` bytes,
    which is read through in bounded pieces, never held whole). A missing file has none."""
    try:
        fh = files.open_regular(path)
    except OSError:
        return
    with fh:
        for raw in files.lines(fh, max_line):  # an overlong line (a sparse file of 8 GiB has one) is None
            if raw is None:
                yield None
                continue
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except (ValueError, RecursionError):
                yield None
                continue
            yield rec if isinstance(rec, dict) else None


def read_tail(path: Path, tail_bytes: Optional[int] = 1 << 20,
              only: Optional[tuple[bytes, ...]] = TRAIN_EVAL_FLAG) -> list[dict[str, Any]]:
    """The JSON objects on the last `tail_bytes` (None: all) of a JSONL file whose line holds one of `only`
    (None: every line). A cut first line, torn lines and lines that are not objects are skipped; a missing file
    has none."""
    lines, _ = _tail_lines(path, tail_bytes)
    return _parse_lines([raw for raw in lines if raw.strip() and (only is None or any(k in raw for k in only))])


def _parse_lines(lines: list[bytes]) -> list[dict[str, Any]]:
    try:  # one parse for the whole tail (several times faster than one per line) ...
        parsed = json.loads(b"[" + b",".join(lines) + b"]")
    except (ValueError, RecursionError):  # ... unless a line is torn (or two make one): then line by line
        parsed = []
        for raw in lines:
            try:
                parsed.append(json.loads(raw))
            except (ValueError, RecursionError):
                continue
    return [rec for rec in parsed if isinstance(rec, dict)]


@dataclass(frozen=True)
class Latest:
    """The newest training record, evaluation record and record with a throughput of a metrics.jsonl, each
    with an integer `step` (None when the file has none)."""

    train: Optional[dict[str, Any]] = None
    val: Optional[dict[str, Any]] = None
    speed: Optional[dict[str, Any]] = None


def latest_records(path: Path) -> Latest:
    """`Latest` of a metrics.jsonl, reading only its end, newest line first: from 64 KiB, growing until all
    three are found or 4 MiB are read (a long run's file is hundreds of MB; `rrtrain status` reads 200 of them)."""
    want = TAIL_START
    while True:
        lines, whole = _tail_lines(path, want)
        found: dict[str, dict[str, Any]] = {}
        for raw in reversed(lines):
            if b'"loss"' not in raw and b'"val_loss"' not in raw:
                continue  # diagnostic, flag and checkpoint lines: not parsed
            _take_latest(raw, found)
            if len(found) == 3:
                break
        if len(found) == 3 or whole or want >= TAIL_MAX:
            return Latest(found.get("loss"), found.get("val_loss"), found.get("tokens_per_s"))
        want *= 4


def _tail_lines(path: Path, tail_bytes: Optional[int]) -> tuple[list[bytes], bool]:
    """The whole lines in the last `tail_bytes` (None: all) of a file, and whether that was the whole file; a
    missing file has none."""
    try:
        with files.open_regular(path) as fh:
            size = fh.seek(0, os.SEEK_END)
            start = 0 if tail_bytes is None else max(0, size - tail_bytes)
            fh.seek(start)
            lines = fh.read().split(b"\n")
    except OSError:
        return [], True
    return (lines[1:] if start > 0 else lines), start == 0  # the first line is probably cut


def _take_latest(raw: bytes, found: dict[str, dict[str, Any]]) -> None:
    """Note one line's record under each of loss / val_loss / tokens_per_s not found yet."""
    try:
        rec = json.loads(raw)
    except (ValueError, RecursionError):
        return  # a line cut by a kill
    if not isinstance(rec, dict):
        return
    step = fields.step(rec.get("step"))
    if step is None:
        return  # no step, or one that is not a whole number: not a record this reader can place
    for key in ("loss", "val_loss", "tokens_per_s"):
        value = rec.get(key, False)  # null is a value here: a non-finite loss is logged as null
        if key not in found and (value is None or fields.is_number(value)):
            found[key] = {**rec, "step": step}
