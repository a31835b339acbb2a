"""The state of one run, from its files (final.json, the lock, the tail of metrics.jsonl) and the scheduler.

metrics.jsonl of a long run is hundreds of MB: only its tail is read (growing from 64 KiB until the last
training line and the last evaluation line are found, up to 4 MiB).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Optional

from launchers.cancel import cancelled_state, read_marker
from launchers.scheduler import ACTIVE, WAITING
from rrtrain.rundir import lock as runlock

STATES = ("pending", "running", "completed", "failed", "preempted", "stalled", "diverged", "unknown")
#: most urgent first: what a person should look at
ATTENTION = ("failed", "diverged", "stalled", "unknown", "preempted", "running", "pending", "completed")
FINISHED = ("completed", "diverged", "stalled")  # a resubmission leaves these alone
TAIL_START, TAIL_MAX = 64 * 1024, 4 * 1024 * 1024


def tail_records(path: Path) -> tuple[Optional[dict], Optional[dict], Optional[dict]]:
    """(last training record, last evaluation record, last record with tokens/s) of a metrics.jsonl,
    reading only its end."""
    try:
        size = path.stat().st_size
    except OSError:
        return None, None, None
    want = TAIL_START
    with open(path, "rb") as f:
        while True:
            start = max(0, size - want)
            f.seek(start)
            lines = f.read(size - start).split(b"\n")
            if start > 0:
                lines = lines[1:]  # the first line is probably cut
            found: dict[str, dict] = {}
            for raw in reversed(lines):
                if len(found) == 3:
                    break
                if b'"loss"' not in raw and b'"val_loss"' not in raw:
                    continue
                try:
                    rec = json.loads(raw)
                except ValueError:
                    continue  # a line cut by a kill
                for key in ("loss", "val_loss", "tokens_per_s"):
                    if key not in found and key in rec:
                        found[key] = rec
            if len(found) == 3 or start == 0 or want >= TAIL_MAX:
                return found.get("loss"), found.get("val_loss"), found.get("tokens_per_s")
            want *= 4


def read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=64)
def _manifest_seq_len(data_path: str) -> Optional[int]:
    m = read_json(Path(data_path) / "manifest.json")
    return m.get("seq_len") if m else None


def total_steps(config: dict) -> Optional[int]:
    """The run's step budget, as the trainer computes it (max_steps wins over tokens)."""
    t, m = config["train"], config["model"]
    if t.get("max_steps") is not None:
        return int(t["max_steps"])
    if t.get("tokens") is None:
        return None
    seq = m.get("seq_len") or (config["data"].get("path") and _manifest_seq_len(config["data"]["path"]))
    if not seq:
        from rrtrain.model.sizing import presets

        preset = presets().get(m["size"])
        seq = preset.seq_len if preset else None
    return max(1, int(t["tokens"]) // (int(t["global_batch"]) * int(seq))) if seq else None


def classify(final: Optional[dict], lock: Optional[dict], scheduler: Optional[str], started: bool,
             submitted: bool, cancelled: Optional[dict] = None) -> str:
    """One state from the evidence, the live evidence first (a requeued run has an old final.json)."""
    if lock is not None and runlock.holder_alive(lock):
        return "running"
    if scheduler in WAITING:
        return "pending"
    if scheduler in ACTIVE:
        return "running"
    if cancelled is not None:
        return cancelled_state(cancelled)
    if final is not None:
        status = final.get("status")
        return status if status in STATES else "unknown"
    if lock is not None or started:
        return "failed"  # it ran and ended without final.json: killed hard
    return "unknown" if submitted else "pending"


def run_row(run_id: str, entry: dict, scheduler: Optional[str], submitted: bool) -> dict[str, Any]:
    """One status row (the `rrtrain status --json` contract)."""
    run_dir = Path(entry["dir"])
    final = read_json(run_dir / "final.json")
    lock = runlock.read(run_dir)
    metrics = run_dir / "metrics.jsonl"
    train, val, speed = tail_records(metrics)
    cancelled = read_marker(run_dir)
    state = classify(final, lock, scheduler, started=train is not None or os.path.exists(metrics),
                     submitted=submitted, cancelled=cancelled)
    step = train.get("step") if train else (final or {}).get("step")
    if final and state in FINISHED + ("failed", "preempted"):
        step = final.get("step", step)
    tokens = (final or {}).get("tokens") if state in FINISHED else None
    if tokens is None and train:
        tokens = train.get("tokens")
    tps = speed.get("tokens_per_s") if speed else None
    val_loss = val.get("val_loss") if val else (final or {}).get("final_val_loss")
    flags = list(final.get("flags", [])) if final else []
    details = dict(final.get("flag_details") or {}) if final else {}
    if cancelled is not None:
        flags.append("cancelled")
        details["cancelled"] = str(cancelled.get("reason", ""))
    return {
        "id": run_id, "variant": entry["variant"], "size": entry["size"], "seed": entry["seed"],
        "scheduler": scheduler, "state": state, "step": step, "total_steps": total_steps(entry["config"]),
        "tokens": tokens, "loss": train.get("loss") if train else None, "val_loss": val_loss,
        "tokens_per_s": tps, "flags": flags, "flag_details": details,
        "dir": str(run_dir),
    }
