"""The status of a sweep, read-only: one row per run (`launchers.state.runstate`, the scheduler's word from
`squeue`, the sweep-level flags of `launchers.state.flags`), the runs that need attention first, the counts by
state, and what pruning saved. `rrtrain status` prints it (`rrtrain.cli.status`), the dashboard's sweep tab
shows it; nothing here writes, signals or cancels.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from launchers.state import runstate
from launchers.state.cache import StatusCache
from launchers.state.flags import monitor_config
from launchers.state.pruning import load_state, saved_line
from launchers.state.scheduler import squeue_states
from launchers.sweep import record
from launchers.sweep.record import RunEntry, SweepRecord
from rrtrain.core.errors import UsageError
from rrtrain.rundir.points import short_name

#: how much of each metrics.jsonl the sweep-level flags read: the plateau test's window with room to spare
STATUS_TAIL_BYTES = 128 * 1024


def collect(sweep_dir: Path, cache: Optional[StatusCache] = None) -> dict[str, Any]:
    """The status object: {"sweep", "dir", "runs": [...], "counts": {state: n}}. `cache` (`--watch`): what
    earlier refreshes read, so that this one reads only what changed. It only reads: whatever sweep.json says
    (`cancel_flagged`), nothing is cancelled here — that is `rrtrain sweep --cancel-flagged`'s job."""
    problems: list[str] = []
    # run entries that cannot be used are left out, one line each
    if os.path.lexists(record.path(sweep_dir)):
        rec = cache.load_record(sweep_dir, problems) if cache is not None else record.load(sweep_dir, problems)
    else:  # a folder of runs not written by `rrtrain sweep` (as `report` and `dashboard` take)
        rec = record_of_runs(sweep_dir)
    if rec is None:
        raise UsageError(f"{sweep_dir}: no sweep.json here (not a sweep directory written by `rrtrain sweep`)")
    for line in problems:
        print(f"rrtrain status: warning: {line}", file=sys.stderr, flush=True)
    rows = list(run_rows(rec, rec.runs, cache=cache).values())
    add_sweep_flags(sweep_dir, rec, rows, cache)
    order = {s: i for i, s in enumerate(runstate.ATTENTION)}
    rows.sort(key=lambda r: (order.get(r["state"], 0), not r["flags"], r["id"]))
    counts = Counter(r["state"] for r in rows)
    out = {"sweep": rec.name or sweep_dir.name, "dir": str(sweep_dir),
           "runs": rows, "counts": {s: counts[s] for s in runstate.STATES if counts[s]}, "problems": problems}
    saved = load_state(sweep_dir).get("saved")
    if isinstance(saved, dict):  # a pruned sweep: what pruning saved, as its last `rrtrain sweep` estimated it
        out["pruning"] = saved
    return out


def record_of_runs(folder: Path) -> SweepRecord:
    """A record for a folder of runs without sweep.json: every run directory below it (any depth, as `rrtrain
    report` finds them), each named by its path under the folder and described by its final.json and config.yaml;
    nothing was submitted, so a run that never started is `pending`. A one-line error when there is no run."""
    from rrtrain.rundir import fields, readers
    from rrtrain.rundir.layout import run_dirs

    if not folder.is_dir():
        raise UsageError(f"{folder}: no sweep.json here, and not a folder of runs (no such directory)")
    runs: dict[str, RunEntry] = {}
    for d in run_dirs(folder):
        config = readers.read_config(d)
        who = readers.identity(readers.read_final(d), config)
        seed = who.seed if isinstance(who.seed, int) else -1
        rid = d.relative_to(folder).as_posix() if d != folder else (folder.resolve().name or ".")
        runs[rid] = RunEntry(fields.text(who.size) or "-", fields.text(who.variant) or "-", seed, str(d), config)
    if not runs:
        raise UsageError(f"{folder}: no sweep.json and no run directory below it (none holds final.json or "
                         "metrics.jsonl)")
    return SweepRecord(name=folder.resolve().name or str(folder), runs=runs)


def run_rows(rec: SweepRecord, entries: dict[str, RunEntry], cache: Optional[StatusCache] = None,
             need_queue: Optional[str] = None) -> dict[str, dict[str, Any]]:
    """Run id -> its status row (`runstate.run_row`) for each of `entries`, with what squeue says of the run's
    latest recorded job: what `rrtrain status`, the dashboard's sweep tab and `rrtrain sweep` (which runs to
    submit, and so the pruning pass) read runs through. `need_queue`: when the sweep has Slurm jobs and squeue
    cannot be read, refuse with this message rather than guess (a queued run would be submitted twice)."""
    last = rec.last_jobs()
    queue = squeue_states() if any(ex == "slurm" for ex, _ in last.values()) else None
    if queue is None and need_queue is not None and any(ex == "slurm" for ex, _ in last.values()):
        raise UsageError(need_queue)
    rows = {}
    for rid, entry in entries.items():
        executor, job = last.get(rid, ("", None))
        sched = queue.get(job) if queue is not None and executor == "slurm" and job else None
        rows[rid] = runstate.run_row(rid, entry, sched, submitted=rid in last, cache=cache)
    return rows


def add_sweep_flags(sweep_dir: Path, rec: SweepRecord, rows: list[dict[str, Any]],
                    cache: Optional[StatusCache] = None) -> None:
    """Add the sweep-level flags (`launchers.state.flags`: no_heartbeat, lagging, early_stall, and the in-run flags
    a running run has raised so far) to the rows; no_heartbeat only where the run is running."""
    from launchers.state.flags import NO_HEARTBEAT, judge_sweep

    resolve = cache.resolve if cache is not None else (lambda p: str(Path(p).resolve()))
    verdicts = {resolve(v.path): v for v in
                judge_sweep(sweep_dir, monitor_config(rec), tail_bytes=STATUS_TAIL_BYTES, live_only=True,
                            reader=cache.read_run if cache is not None else None)}
    for row in rows:
        verdict = verdicts.get(resolve(row["dir"]))
        if verdict is None:
            continue
        for name, why in verdict.flags.items():
            if name == NO_HEARTBEAT and row["state"] != "running":
                continue
            if name not in row["flags"]:
                row["flags"].append(name)
            row["flag_details"].setdefault(name, why)


def _num(v: Any, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, (int, float)) else "-"


def grid_keys(rows: list[dict[str, Any]]) -> list[str]:
    """The grid keys any run has a value for (a sweep with a `grid:`), sorted."""
    return sorted({k for r in rows for k in (r.get("point") or {})})


def table(status: dict[str, Any]) -> str:
    """The status as a table; a `nodes` column (the hosts a distributed run's ranks ran on) when any has one,
    and one column per grid key (its last part: `lr`) in a sweep with a grid."""
    spans = any(r.get("nodes") for r in status["runs"])
    keys = grid_keys(status["runs"])
    width = max([28] + [len(r["id"]) for r in status["runs"]])
    cols = [(k, max([len(short_name(k))] + [len(str((r.get("point") or {}).get(k, "-"))) for r in status["runs"]]))
            for k in keys]
    head = "".join(f"{short_name(k):>{w}} " for k, w in cols)
    lines = [f"sweep {status['sweep']} ({status['dir']})",
             f"{'run':<{width}} {'variant':<14} {'size':<9} {head}{'seed':>4} {'sched':<10} {'state':<10} "
             f"{'step':>15} {'tokens':>13} {'loss':>8} {'val':>8} {'tok/s':>9}  " + ("nodes  " if spans else "")
             + "flags"]
    for r in status["runs"]:
        step = f"{_num(r['step'], 'd')}/{_num(r['total_steps'], 'd')}"
        where = f"{','.join(r.get('nodes') or []) or '-'}  " if spans else ""
        setting = "".join(f"{str((r.get('point') or {}).get(k, '-')):>{w}} " for k, w in cols)
        lines.append(f"{r['id']:<{width}} {r['variant']:<14} {r['size']:<9} {setting}{r['seed']:>4} "
                     f"{r['scheduler'] or '-':<10} "
                     f"{r['state']:<10} {step:>15} {_num(r['tokens'], ',d'):>13} {_num(r['loss'], '.4f'):>8} "
                     f"{_num(r['val_loss'], '.4f'):>8} {_num(r['tokens_per_s'], ',.0f'):>9}  {where}"
                     f"{','.join(r['flags']) or ''}")
    lines.append("  ".join(f"{s}: {n}" for s, n in status["counts"].items()) + f"  (total {len(status['runs'])})")
    if status.get("pruning"):
        lines.append(saved_line(status["pruning"]))
    return "\n".join(lines)

