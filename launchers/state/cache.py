"""What `rrtrain status --watch` keeps between refreshes, so that a refresh reads only what changed.

Per run: its metrics.jsonl followed by `rrtrain.rundir.tail.MetricsTail` (first its end only, as `rrtrain
status` reads it, then only the bytes appended since), its
final.json and cancelled.json parsed again only when their identity (inode, size, mtime) changes, and its
sweep-level verdict (`launchers.state.flags.read_run`, which reads the tail of metrics.jsonl and the
config) read again only when final.json, metrics.jsonl or config.yaml changed. sweep.json too is parsed again
only when it changed. The flags that depend on the clock or on the other runs (no_heartbeat, lagging,
early_stall) are still judged at every refresh, from the kept verdicts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

from rrtrain.rundir import layout, readers
from rrtrain.rundir.readers import Cancelled, Final, Latest
from rrtrain.rundir.tail import FileCache, FileKey, MetricsTail, file_key


class StatusCache:
    """The per-run state kept across `rrtrain status --watch` refreshes (see the module docstring)."""

    def __init__(self) -> None:
        self.tails: dict[Path, MetricsTail] = {}
        self.finals: FileCache[Optional[Final]] = FileCache(lambda p: readers.read_final(p.parent))
        self.cancels: FileCache[Optional[Cancelled]] = FileCache(lambda p: readers.read_cancelled(p.parent))
        self.verdicts: dict[Path, tuple[tuple[Optional[FileKey], ...], Any]] = {}
        self.verdict_reads = 0  # how many verdicts were read from the files (a test counts them)
        self.record: Optional[tuple[FileKey, Optional[dict[str, Any]], list[str]]] = None
        self.resolved: dict[str, str] = {}

    def latest(self, run_dir: Path) -> Latest:
        """The newest training, evaluation and throughput records, from the bytes appended since last time."""
        path = readers.metrics_path(run_dir)
        tail = self.tails.get(path)
        if tail is None:
            tail = self.tails[path] = MetricsTail(path)
            tail.start_at_end()  # the latest values from the file's end (status never needs its history)
        tail.refresh()
        return tail.latest()

    def final(self, run_dir: Path) -> Optional[Final]:
        return self.finals.get(Path(run_dir) / layout.FINAL)

    def cancelled(self, run_dir: Path) -> Optional[Cancelled]:
        return self.cancels.get(Path(run_dir) / layout.CANCELLED)

    def load_record(self, sweep_dir: Path, problems: list[str]) -> Optional[dict[str, Any]]:
        """sweep.json as `launchers.sweep.record.load` reads it (problems said in `problems`), parsed again only when
        the file changed."""
        from launchers.sweep import record

        key = file_key(record.path(sweep_dir))
        if key is not None and self.record is not None and self.record[0] == key:
            problems.extend(self.record[2])
            return self.record[1]  # the same object: `rrtrain status` only reads it
        found: list[str] = []
        rec = record.load(sweep_dir, found)
        problems.extend(found)
        self.record = (key, rec, found) if key is not None else None
        return rec

    def resolve(self, path: str | Path) -> str:
        """`str(Path(path).resolve())`, kept (a run directory does not move while it is watched)."""
        got = self.resolved.get(str(path))
        if got is None:
            got = self.resolved[str(path)] = str(Path(path).resolve())
        return got

    def read_run(self, path: Path, root: Path, tail_bytes: int) -> Any:
        """`launchers.state.flags.read_run`, kept while the run's final.json, metrics.jsonl and config.yaml are unchanged;
        a fresh copy each time (the caller adds flags to it)."""
        from launchers.state.flags import read_run

        keys = tuple(file_key(path / name) for name in (layout.FINAL, layout.METRICS, layout.CONFIG))
        hit = self.verdicts.get(path)
        if hit is None or hit[0] != keys:
            verdict = read_run(path, root, tail_bytes)
            self.verdict_reads += 1
            self.verdicts[path] = (keys, verdict)
        else:
            verdict = hit[1]
        return dataclasses.replace(verdict, flags=dict(verdict.flags))
