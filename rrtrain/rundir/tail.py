"""Reading a run's files again and again without reading them again: what `rrtrain status --watch` and the live
dashboard keep between refreshes.

`MetricsTail` follows one metrics.jsonl: it keeps the byte offset it has read up to and the state derived from
what it read (last step, last training / evaluation / throughput record, the flags raised), so a refresh reads
only the bytes appended since. The file is known by its identity (device, inode, size, mtime): an unchanged one
is not opened at all, and a replaced one (a fresh start or a resume cuts metrics.jsonl back by an atomic
replace: a new inode, or fewer bytes than were read) is read again from its start, its derived state dropped.
A last line without its newline yet is a line still being written: it is left for the next refresh. Every line
is untrusted: one that is not a JSON object, or has no whole-number step, is skipped.

`FileCache` keeps a small file's parsed content (final.json, cancelled.json) for as long as its identity holds.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, Optional, TypeVar

from rrtrain.core import files
from rrtrain.rundir import fields
from rrtrain.rundir.readers import Latest

#: (device, inode, size, mtime in ns): a file as `stat` sees it; equal keys mean nothing to read again
FileKey = tuple[int, int, int, int]
#: the most a refresh reads of one file; the rest waits for the next refresh (memory stays bounded)
READ_MAX = 64 * 1024 * 1024

T = TypeVar("T")


def file_key(path: str | os.PathLike[str]) -> Optional[FileKey]:
    """The file's identity, or None when it is missing or cannot be stat'ed."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class Flag:
    """A flag line of metrics.jsonl (`{"kind": "flag", "flag": NAME, "step": S, "detail": WHY}`)."""

    name: str
    step: int
    detail: str


@dataclass
class MetricsTail:
    """One metrics.jsonl, read incrementally (see the module docstring)."""

    path: Path
    offset: int = 0  # bytes read: always the end of a whole line
    key: Optional[FileKey] = None  # the identity when last read to its end; None forces a look
    ident: Optional[tuple[int, int]] = None  # (device, inode) of the file the offset is in
    generation: int = 0  # how many times the file was found replaced and read again from its start
    last_step: Optional[int] = None
    train: Optional[dict[str, Any]] = None  # the newest record with a `loss`
    val: Optional[dict[str, Any]] = None  # ... with a `val_loss`
    speed: Optional[dict[str, Any]] = None  # ... with a `tokens_per_s`
    flags: dict[str, Flag] = field(default_factory=dict)  # by name, the first time each was raised
    bytes_read: int = 0  # over the tail's life: what a test counts to show nothing is read twice
    skipping: bool = False  # inside a line longer than READ_MAX (not one rrtrain wrote): dropped to its newline

    def latest(self) -> Latest:
        return Latest(self.train, self.val, self.speed)

    def _reset(self) -> None:
        self.offset, self.key, self.ident, self.last_step = 0, None, None, None
        self.skipping = False
        self.train = self.val = self.speed = None
        self.flags = {}
        self.generation += 1

    def start_at_end(self) -> None:
        """Begin after the file's last whole line, the state seeded from its end only
        (`readers.latest_records`: the last training, evaluation and throughput records; flags raised earlier
        are not seen): for a reader that wants the latest values of a long file, not its history (`rrtrain
        status --watch`). The records it may see again at the next refresh are the newest: applying them again
        leaves the same state."""
        from rrtrain.rundir.readers import latest_records

        try:
            with files.open_regular(self.path) as fh:
                st = os.fstat(fh.fileno())
                back = min(st.st_size, 64 * 1024)
                fh.seek(st.st_size - back)
                end = fh.read(back).rfind(b"\n")
        except OSError:
            return
        if end < 0:
            return  # no whole line near the end (or none at all): read from the start
        self.offset, self.ident = st.st_size - back + end + 1, (st.st_dev, st.st_ino)
        latest = latest_records(self.path)
        self.train, self.val, self.speed = latest.train, latest.val, latest.speed
        self.last_step = max((r["step"] for r in (latest.train, latest.val, latest.speed) if r), default=None)

    def refresh(self) -> list[dict[str, Any]]:
        """The records appended since the last refresh (their `step` a whole number, as an int), the derived
        state updated. After a replacement they are the new file's records from its start (`generation` says
        so); a missing file resets the state and has none."""
        key = file_key(self.path)
        if key is None:
            if self.key is not None or self.offset:
                self._reset()
            return []
        if key == self.key:
            return []
        try:
            fh = files.open_regular(self.path)
        except OSError:
            return []
        with fh:
            st = os.fstat(fh.fileno())
            now = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            if self.ident is not None and (now[:2] != self.ident or now[2] < self.offset):
                self._reset()  # replaced (a resume's cut, a fresh start): everything derived from it is void
            self.ident = now[:2]
            fh.seek(self.offset)
            data = fh.read(min(now[2] - self.offset, READ_MAX)) if now[2] > self.offset else b""
        if self.skipping or (len(data) >= READ_MAX and b"\n" not in data):  # an over-long line: passed over
            newline = data.find(b"\n")
            cut = newline + 1 if newline >= 0 else len(data)
            self.skipping = newline < 0  # its newline not reached yet
            self.offset, self.bytes_read, data = self.offset + cut, self.bytes_read + cut, data[cut:]
        end = data.rfind(b"\n") + 1  # a last line without its newline is still being written
        self.offset += end
        self.bytes_read += end
        self.key = now if self.offset == now[2] else None  # a torn tail or a capped read: look again next time
        out = []
        for raw in data[:end].split(b"\n"):
            rec = _record(raw)
            if rec is not None:
                self._take(rec)
                out.append(rec)
        return out

    def _take(self, rec: dict[str, Any]) -> None:
        step = rec["step"]
        self.last_step = step if self.last_step is None else max(self.last_step, step)
        if rec.get("kind") == "flag":
            name = fields.text(rec.get("flag"))
            if name is not None and name not in self.flags:
                self.flags[name] = Flag(name, step, fields.text(rec.get("detail")) or "")
            return
        for key, attr in (("loss", "train"), ("val_loss", "val"), ("tokens_per_s", "speed")):
            value = rec.get(key, False)  # null is a value here: a non-finite loss is logged as null
            if value is None or fields.is_number(value):
                setattr(self, attr, rec)


def _record(raw: bytes) -> Optional[dict[str, Any]]:
    """One line's record with a whole-number step (stored as an int), or None."""
    if not raw.strip():
        return None
    try:
        rec = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(rec, dict):
        return None
    step = fields.step(rec.get("step"))
    if step is None:
        return None
    if type(rec["step"]) is not int:
        rec["step"] = step
    return rec


class FileCache(Generic[T]):
    """A small file's parsed content, kept while the file's identity holds (parsed again when it changes)."""

    def __init__(self, parse: Callable[[Path], T]) -> None:
        self.parse = parse
        self.entries: dict[Path, tuple[Optional[FileKey], T]] = {}
        self.parses = 0  # how many times a file was parsed: what a test counts

    def get(self, path: Path) -> T:
        key = file_key(path)
        hit = self.entries.get(path)
        if hit is not None and hit[0] == key:  # unchanged, or still missing
            return hit[1]
        value = self.parse(path)
        self.parses += 1
        self.entries[path] = (key, value)
        return value
