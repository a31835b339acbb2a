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
from typing import Any, Optional

from rrtrain.core import untrusted
from rrtrain.core.io import atomic_write_bytes, atomic_write_text
from rrtrain.rundir import fields, layout


class MetricsLogger:
    def __init__(self, run_dir: Path, enabled: bool, resume_step: Optional[int] = None) -> None:
        self.enabled = enabled
        self.path = Path(run_dir) / layout.METRICS
        self.tb = None
        if not enabled:
            return
        if resume_step is not None:
            self._truncate(resume_step)
        elif self.path.exists():
            # replaced, not unlinked: a reader (status, the monitor, a test) never finds the file missing
            atomic_write_text(self.path, "")
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(Path(run_dir) / layout.TENSORBOARD), purge_step=None if resume_step is None else resume_step + 1)
        self.file = self.path.open("a")

    def _truncate(self, step: int) -> None:
        if not self.path.exists():
            return
        kept = []
        with untrusted.open_regular(self.path) as fh:  # read as bytes: a line that is not UTF-8 is garbage, not a crash
            for raw in fh:
                try:
                    rec = json.loads(raw)
                except (ValueError, RecursionError):
                    continue  # a line cut by a kill, or garbage
                if not isinstance(rec, dict):
                    continue  # not a record: nothing of ours
                at = fields.step(rec.get("step", 0))
                if at is not None and at <= step:
                    kept.append(raw.rstrip(b"\r\n") + b"\n")
        atomic_write_bytes(self.path, b"".join(kept))

    def log(self, record: dict[str, Any], tb_prefix: str = "train") -> None:
        """Append one record (non-finite numbers become null: the file stays valid JSON) and mirror it."""
        if not self.enabled:
            return
        record = {k: _finite_or_none(v) for k, v in record.items()}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        step = record["step"]
        for key, value in record.items():
            if key in ("step", "kind") or value is None:
                continue
            if isinstance(value, (int, float)):
                self.tb.add_scalar(f"{tb_prefix}/{key}", value, step)
            elif isinstance(value, list):
                for i, v in enumerate(value):
                    if isinstance(v, (int, float)):
                        self.tb.add_scalar(f"{tb_prefix}/{key}/{i:03d}", v, step)

    def log_flag(self, flag: dict[str, Any]) -> None:
        """A monitor flag: a metrics line, a TensorBoard scalar `monitor/NAME` = 1 and a text entry."""
        if not self.enabled:
            return
        self.file.write(json.dumps(flag) + "\n")
        self.file.flush()
        self.tb.add_scalar(f"monitor/{flag['flag']}", 1.0, flag["step"])
        self.tb.add_text("monitor/flags", f"**{flag['flag']}** at step {flag['step']}: {flag['detail']}", flag["step"])

    def flush(self) -> None:
        if self.enabled:
            self.file.flush()
            self.tb.flush()

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            self.tb.close()


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return value
