"""The state of one run, from its files (final.json, the lock, cancelled.json, the tail of metrics.jsonl: read
through `rrtrain.rundir.readers`, which reads only the tail of a long run's metrics) and the scheduler."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Optional

from launchers.state.scheduler import ACTIVE, WAITING
from launchers.sweep.record import RunEntry
from rrtrain import budget
from rrtrain.rundir import fields, ranks, readers
from rrtrain.rundir import lock as runlock
from rrtrain.rundir.outcome import CANCELLED, ENDED_FOR_GOOD, decide
from rrtrain.rundir.points import read_point
from rrtrain.rundir.readers import Cancelled, Final

STATES = ("pending", "running", "completed", "failed", "preempted", "stalled", "diverged", "unknown", "paused",
          "pruned")
#: most urgent first: what a person should look at
ATTENTION = ("failed", "diverged", "stalled", "unknown", "preempted", "running", "pending", "paused", "pruned",
             "completed")
FINISHED = ENDED_FOR_GOOD  # a resubmission leaves these alone


@functools.lru_cache(maxsize=64)
def _manifest_seq_len(data_path: str) -> Optional[int]:
    m = readers.read_json_object(Path(data_path) / "manifest.json")
    return fields.count(m.get("seq_len")) if m else None


def total_steps(config: dict) -> Optional[int]:
    """The run's step budget, as the trainer computes it (max_steps wins over tokens); None when the recorded
    config does not say (a section missing or of the wrong type: it came from a file)."""
    dig = fields.dig
    max_steps, tokens = fields.count(dig(config, "train", "max_steps")), fields.count(dig(config, "train", "tokens"))
    if max_steps is not None or tokens is None:
        return budget.total_steps(max_steps, None, 1)
    data = fields.data_sources(config)  # a mixture's sources share their seq_len
    seq = fields.count(dig(config, "model", "seq_len")) or (data and _manifest_seq_len(data[0][0]))
    if not seq:
        from rrtrain.sizing import presets

        preset = presets().get(fields.text(dig(config, "model", "size")) or "")
        seq = preset.seq_len if preset else None
    batch = fields.count(dig(config, "train", "global_batch"))
    return budget.total_steps(None, tokens, batch * int(seq)) if seq and batch and batch > 0 else None


def classify(final: Optional[Final], lock: Optional[dict], scheduler: Optional[str], started: bool,
             submitted: bool, cancelled: Optional[Cancelled] = None) -> str:
    """One state from the evidence, the live evidence first (a requeued run has an old final.json). What the
    run's files say is settled by `rrtrain.rundir.outcome.decide`, the function the run itself ended by: it
    turns a cancelled run that could not write (killed hard) into what it was flagged."""
    if lock is not None and runlock.holder_alive(lock):
        return "running"
    if scheduler in WAITING:
        return "pending"
    if scheduler in ACTIVE:
        return "running"
    if final is not None:
        ended = final.status if final.status in STATES else "unknown"
    elif lock is not None or started:
        ended = "failed"  # it ran and ended without final.json: killed hard
    else:
        ended = "unknown" if submitted else "pending"
    return decide(ended, "", cancelled).status


def run_row(run_id: str, entry: RunEntry, scheduler: Optional[str], submitted: bool,
            cache: Optional[Any] = None) -> dict[str, Any]:
    """One status row (the `rrtrain status --json` contract). `cache`: a `launchers.state.cache.StatusCache`
    (`status --watch`), which reads only what changed since the last refresh."""
    run_dir = Path(entry.dir)
    final = cache.final(run_dir) if cache is not None else readers.read_final(run_dir)
    lock = runlock.read(run_dir)
    metrics = readers.metrics_path(run_dir)
    latest = cache.latest(run_dir) if cache is not None else readers.latest_records(metrics)
    train, val, speed = latest.train, latest.val, latest.speed
    cancelled = cache.cancelled(run_dir) if cache is not None else readers.read_cancelled(run_dir)
    state = classify(final, lock, scheduler, started=train is not None or os.path.exists(metrics),
                     submitted=submitted, cancelled=cancelled)
    step = train["step"] if train else (final.step if final else None)
    if final and state in FINISHED + ("failed", "preempted"):
        step = final.step if final.step is not None else step
    tokens = final.tokens if final and state in FINISHED else None
    if tokens is None and train:
        tokens = fields.count(train.get("tokens"))
    tps = fields.finite(speed.get("tokens_per_s")) if speed else None  # finite: `status --json` stays JSON
    val_loss = fields.finite(val.get("val_loss")) if val else (final.final_val_loss if final else None)
    flags = list(final.flags) if final else []
    details = dict(final.flag_details) if final else {}
    if cancelled is not None:
        if CANCELLED not in flags:
            flags.append(CANCELLED)
        details.setdefault(CANCELLED, cancelled.reason)
    return {
        "id": run_id, "variant": entry.variant, "size": entry.size, "seed": entry.seed,
        "point": read_point(entry.config),
        "scheduler": scheduler, "state": state, "step": step, "total_steps": total_steps(entry.config),
        "tokens": tokens, "loss": fields.finite(train.get("loss")) if train else None, "val_loss": val_loss,
        "tokens_per_s": tps, "flags": flags, "flag_details": details, "nodes": ranks.nodes(run_dir),
        "dir": str(run_dir),
    }
