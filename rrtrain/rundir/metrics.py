"""Run metrics: `metrics.jsonl` (the source of truth, rank 0) mirrored to TensorBoard.

One JSON object per line: training lines carry `step` and `loss`, evaluation lines `step` and `val_loss`,
diagnostic lines `"kind": "diag"`. On resume the file is cut back to the checkpoint's step (the dropped
lines are recomputed identically) and TensorBoard is told to purge the same steps, so every step appears
exactly once. A fresh start empties the file by replacing it, so a reader never finds it missing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional, TextIO

from rrtrain.core import files
from rrtrain.core.io import atomic_write_text
from rrtrain.rundir import events, fields, layout


#: a metrics line longer than this is not one rrtrain wrote (a diagnostic line of a deep model is a few kB)
MAX_LINE_BYTES = files.MAX_LINE_BYTES


class MetricsLogger:
    def __init__(self, run_dir: Path, enabled: bool, resume_step: Optional[int] = None) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / layout.METRICS
        self.tb = None
        if not enabled:
            return
        if resume_step is not None:
            self._truncate(resume_step)
        else:
            # replaced, not unlinked: a reader (status, the monitor, a test) never finds the file missing
            atomic_write_text(self.path, "")
        tb_dir = Path(run_dir) / layout.TENSORBOARD
        files.make_dirs(tb_dir)
        self.tb = events.EventFile(tb_dir / events.new_name())
        if resume_step is not None:
            self.tb.append([events.restart(resume_step + 1)])
        self.file = open_for_append(self.path)

    def _truncate(self, step: int) -> None:
        """Keep the records up to `step`, streamed into a file written aside and renamed (the file may be
        large; a line longer than MAX_LINE_BYTES is garbage, skipped without being held in memory)."""
        try:
            src = files.open_regular(self.path)  # read as bytes: a line not UTF-8 is garbage, not a crash
        except FileNotFoundError:
            src = None
        with files.atomic_writer(self.path.parent, self.path.name, make_parents=False) as out:
            if src is None:
                return
            with src:
                for raw in _lines(src, MAX_LINE_BYTES):
                    try:
                        rec = json.loads(raw)
                    except (ValueError, RecursionError):
                        continue  # a line cut by a kill, or garbage
                    if not isinstance(rec, dict):
                        continue  # not a record: nothing of ours
                    at = fields.step(rec.get("step", 0))
                    if at is not None and at <= step:
                        out.write(raw.rstrip(b"\r\n") + b"\n")

    def log(self, record: dict[str, Any], tb_prefix: str = "train") -> None:
        """Append one record (non-finite numbers become null: the file stays valid JSON) and mirror it."""
        if not self.enabled:
            return
        record = {k: _finite_or_none(v) for k, v in record.items()}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        values: dict[str, float] = {}
        for key, value in record.items():
            if key in ("step", "kind") or value is None:
                continue
            if isinstance(value, (int, float)):
                values[f"{tb_prefix}/{key}"] = value
            elif isinstance(value, list):
                for i, v in enumerate(value):
                    if isinstance(v, (int, float)):
                        values[f"{tb_prefix}/{key}/{i:03d}"] = v
        if values:
            self.tb.append([events.event(events.scalars(values), record["step"])])

    def log_flag(self, flag: dict[str, Any]) -> None:
        """A monitor flag: a metrics line, a TensorBoard scalar `monitor/NAME` = 1 and a text entry."""
        if not self.enabled:
            return
        self.file.write(json.dumps(flag) + "\n")
        self.file.flush()
        step = flag["step"]
        note = f"**{flag['flag']}** at step {step}: {flag['detail']}"
        self.tb.append([events.event(events.scalars({f"monitor/{flag['flag']}": 1.0}), step),
                        events.event(events.text("monitor/flags", note), step)])

    def flush(self) -> None:
        if self.enabled:
            self.file.flush()  # the event file has no buffer: each append is written at once

    def close(self) -> None:
        if self.enabled:
            self.file.close()


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return value


def open_for_append(path: Path) -> TextIO:
    """`path` opened for appending, never through a symbolic link and only when it is a regular file (a FIFO
    would block the writer): OSError otherwise (`files.open_append`). The trainer checks its files before it
    starts (`rrtrain.rundir.own_files`); this holds even if one is swapped meanwhile."""
    return files.open_append(path)  # type: ignore[return-value]


def _lines(fh: BinaryIO, limit: int) -> Iterator[bytes]:
    """The lines of `fh`, each at most `limit` bytes; a longer one is read through and left out."""
    return (line for line in files.lines(fh, limit) if line is not None)
