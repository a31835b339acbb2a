"""`SWEEP_DIR/prune.json` as `rrtrain status` reads it: what the last pass of successive halving decided and
what pruning saved (`launchers.prune.rungs` writes it). Read-only and untrusted: an unreadable file is an
empty state, and its values are never used to rank runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rrtrain.rundir import fields, readers

STATE = "prune.json"


def load_state(out: Path) -> dict[str, Any]:
    """prune.json (untrusted: an unreadable one is started afresh, its values read again)."""
    data = readers.read_json_object(Path(out) / STATE)
    return data if data is not None else {}


def saved_line(saved: dict[str, Any]) -> str:
    """One line: what pruning saved (GPU-hours for GPU runs, the share of the training FLOPs for every run)."""
    n = fields.integer(saved.get("pruned_runs")) or 0
    sf, af = fields.number(saved.get("saved_flops")) or 0.0, fields.number(saved.get("all_flops")) or 0.0
    share = f"{sf / af:.0%}" if af else "0%"
    sh, ah = fields.number(saved.get("saved_gpu_hours")), fields.number(saved.get("all_gpu_hours"))
    if sh is None or ah is None:
        return (f"pruning: {n} run(s) pruned, saving {share} of the training FLOPs of running every point to the "
                f"end ({sf:.3g} of {af:.3g}; CPU runs: no GPU-hours)")
    return (f"pruning: {n} run(s) pruned, saving {sh:,.3g} GPU-h of the {ah:,.3g} GPU-h of running every point to "
            f"the end ({share}, by the --dry-run estimate)")
