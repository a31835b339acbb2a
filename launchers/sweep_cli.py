"""`rrtrain sweep SWEEP.yaml --out DIR [--executor slurm|local|debug] [--parallel N] [--dry-run] [key=value ...]`

Expand a sweep file into runs (SIZE-VARIANT-sSEED, or SIZE-VARIANT-POINT-sSEED for the points of a `grid:`, e.g.
tiny-review-lr3e-3-s0; one directory each under DIR) and submit the ones that
need it: a new run, or one that failed or was preempted (it resumes from its checkpoint). Completed,
diverged and stalled runs are left alone, and so are runs that are queued or training now. A sweep file
that changes an existing run's config is refused, listing the differences; adding sizes, seeds or grid values adds
runs.

  slurm   one submitit job array per resource shape; returns once queued (prints the job ids)
  local   subprocesses on this machine, --parallel at a time, a log per run in DIR/slurm/logs/
  debug   one after another in this process

With `prune:` in the sweep file, runs pause at rungs and the worst points of each (size, variant) are pruned
(successive halving): the local and debug executors go rung by rung to the end; with slurm, run the command
again once a rung's runs have paused to take the next one. The summary says what pruning saved.

--dry-run prints the runs, their resources and GPU-hours, and writes DIR/slurm/*.sbatch (submit them with
sbatch, no Python needed) without submitting anything. Trailing `key.sub=value` arguments override the
sweep file's own keys, e.g. `resources.partition=debug sizes.tiny.seeds=1`.

Exit status: 0 when submitted (slurm) or when every run completed (local, debug), 1 when a run did not,
2 for bad input.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Optional

import yaml

from launchers import cancel, prune_submit, prune_sweep, record, runstate, snapshot, spec, sweep_lock
from launchers.entry import config_path
from launchers.estimate import check_gpu, cost, grid_costs
from launchers.expand import Run, check_safe, data_path, expand
from launchers.render import render
from launchers.run_here import run_here
from launchers.scheduler import squeue_states
from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError
from rrtrain.core.io import atomic_write_text, unwritable_reason
from rrtrain.rundir.readers import read_cancelled


def parse(argv: list[str]) -> argparse.Namespace:
    p = CommandParser(prog="rrtrain sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", help="a sweep file (configs/sweeps/*.yaml); with --cancel-flagged, a sweep directory")
    p.add_argument("--out", help="the sweep directory (default: the sweep file's `out`)")
    p.add_argument("--executor", choices=["slurm", "local", "debug"], default="local")
    p.add_argument("--parallel", type=int, default=1, help="local: runs at a time (default 1)")
    p.add_argument("--dry-run", action="store_true", help="print and render, submit nothing")
    p.add_argument("--lock-wait", type=float, default=sweep_lock.DEFAULT_WAIT_S, metavar="S",
                   help="seconds to wait for another `rrtrain sweep` on the same directory to finish "
                        f"(default {sweep_lock.DEFAULT_WAIT_S:g}), then refuse")
    p.add_argument("--cancel-flagged", action="store_true",
                   help="cancel the jobs of the sweep directory's stalled and diverged runs, recording why")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override the sweep file's keys")
    return p.parse_intermixed_args(argv)


def sweep_dir(sweep: spec.Sweep, out: Optional[str]) -> Path:
    if out is None and sweep.spec.out is None:
        raise UsageError("no sweep directory: pass --out DIR (or set `out:` in the sweep file)")
    p = Path(out) if out is not None else Path(sweep.spec.out).expanduser()
    if out is None and not p.is_absolute():
        p = sweep.path.parent / p
    return Path(check_safe(str(p.resolve()), "sweep directory"))


def check_writable(out: Path) -> None:
    """A file in the way, a read-only mount: one line now, not a traceback later (creates `out`)."""
    why = unwritable_reason(out)
    if why is not None:
        raise UsageError(f"sweep directory {out} cannot be written: {why}")


def to_submit(runs: list[Run], rec: Optional[dict]) -> tuple[list[Run], dict[str, str]]:
    """The runs that need submitting, and the state of every run that does not."""
    if rec is None:
        return list(runs), {}
    last = record.last_jobs(rec)
    queue = None
    if any(ex == "slurm" for ex, _ in last.values()):
        queue = squeue_states()
        if queue is None:  # a queued run would be submitted twice
            raise UsageError("this sweep has Slurm jobs, and squeue cannot be read here: run `rrtrain sweep` "
                             "where squeue works, so that queued runs are not submitted twice")
    todo, skipped = [], {}
    for run in runs:
        executor, job = last.get(run.id, ("", None))
        sched = queue.get(job) if queue is not None and executor == "slurm" and job else None
        row = runstate.run_row(run.id, record.run_entry(run), sched, submitted=run.id in last)
        state = row["state"]
        if state in runstate.FINISHED or state == "running" or (state == "pending" and sched is not None):
            skipped[run.id] = state
        else:
            todo.append(run)
    return todo, skipped


def prepare_data(sweep: spec.Sweep, out: Path, dry_run: bool) -> None:
    """`prep:` sweeps prepare their data once, into DIR/data, before anything is submitted."""
    p = sweep.spec.prep
    if p is None or (out / "data" / "manifest.json").exists():
        return
    cmd = [sys.executable, "-m", "rrtrain", "prep", "--source", p.source, "--tokenizer", p.tokenizer,
           "--seq-len", str(p.seq_len), "--out", str(out / "data"), "--seed", str(p.seed)]
    if p.num_docs is not None:
        cmd += ["--num-docs", str(p.num_docs)]
    if p.val_fraction is not None:
        cmd += ["--val-fraction", str(p.val_fraction)]
    if dry_run:
        print(f"would prepare the data: {' '.join(cmd[1:])}")
        return
    print(f"preparing the data: {out / 'data'}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise UsageError(f"data prep failed (exit {proc.returncode}): {last}")


def print_plan(sweep: spec.Sweep, runs: list[Run], todo: list[Run], skipped: dict[str, str]) -> None:
    width = max([28] + [len(r.id) for r in runs])
    print(f"{'run':<{width}} {'state':<10} {'nodes x tasks':>13} {'gpus':>5} {'time':>6} {'params':>13} "
          f"{'tokens':>15} {'GPU-h':>9}")
    total = 0.0
    submit_ids = {r.id for r in todo}
    for run in runs:
        c = cost(run, sweep.spec.gpu, sweep.spec.mfu)
        r = run.resources
        state = "submit" if run.id in submit_ids else skipped.get(run.id, "-")
        gh = f"{c.gpu_hours:,.1f}" if c.gpu_hours is not None else "cpu"
        total += c.gpu_hours or 0.0
        print(f"{run.id:<{width}} {state:<10} {f'{r.nodes} x {r.tasks}':>13} {r.nodes * r.gpus_per_node:>5} "
              f"{r.time_min:>5}m {c.params:>13,} {c.tokens:>15,} {gh:>9}")
    for g in grid_costs(runs, sweep.spec.gpu, sweep.spec.mfu):
        gh = f"{g.gpu_hours:,.1f} GPU-hours" if g.gpu_hours is not None else "cpu"
        print(f"grid {g.size} {g.variant}: {g.points} points x {g.runs // g.points} seeds = {g.runs} runs, {gh}")
    print(f"{len(todo)} of {len(runs)} runs to submit; GPU-hours for the whole sweep at "
          f"{sweep.spec.mfu:.0%} MFU on {sweep.spec.gpu}: {total:,.1f}")


def cancel_command(out: Path) -> int:
    """`rrtrain sweep --cancel-flagged SWEEP_DIR`."""
    if record.load(out) is None:
        raise UsageError(f"{out}: no sweep.json here (--cancel-flagged takes a sweep directory)")
    done = cancel.cancel_flagged(out)
    print(f"cancelled {len(done)} flagged run(s)" if done else "no run is flagged stalled or diverged: nothing cancelled")
    return 0


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.parallel < 1:
        raise UsageError(f"--parallel must be at least 1, got {args.parallel}")
    if args.cancel_flagged:
        return cancel_command(Path(args.sweep))
    if not 0 <= args.lock_wait < 1e7:
        raise UsageError(f"--lock-wait must be a number of seconds, got {args.lock_wait}")
    sweep = spec.load(args.sweep, args.overrides)
    check_gpu(sweep.spec.gpu)
    out = sweep_dir(sweep, args.out)
    # a bad sweep file, and rungs that cannot be placed, are refused before anything is created
    runs = expand(sweep, out, data_path(sweep, out))
    rungs = prune_submit.rung_lines(sweep.spec.prune, runs) if sweep.spec.prune is not None else []
    check_writable(out)
    with sweep_lock.hold_sweep(out, args.lock_wait):  # one submission at a time (launchers.sweep_lock)
        return submit(args, sweep, out, runs, rungs)


def submit(args: argparse.Namespace, sweep: spec.Sweep, out: Path, runs: list[Run], rungs: list[str]) -> int:
    """Everything from reading sweep.json to the last job id recorded; the caller holds the sweep's lock."""
    old = record.load(out)
    rec = record.merge(old, sweep, runs)  # refuses a changed run before anything is written
    todo, skipped = to_submit(runs, old)
    python = check_safe(sys.executable, "python path")

    prepare_data(sweep, out, args.dry_run)
    rec["code"] = snapshot.take(out, rec.get("code"))
    configs = {r.id: config_path(out, r.id) for r in runs}
    for r in runs:
        atomic_write_text(configs[r.id], yaml.safe_dump(r.config, sort_keys=False))
    scripts = render(out, sweep.spec.name, runs, python, rec["code"]["path"], configs)
    if args.dry_run:
        print_plan(sweep, runs, todo, skipped)
        if rungs:
            print("\n".join(rungs))
        for s in scripts:
            print(f"rendered {s['script']} ({len(s['runs'])} runs{', array ' + s['array'] if s['array'] else ''}): "
                  f"{s['submit']}")
        print("dry run: nothing submitted")
        return 0
    for rid, state in skipped.items():
        print(f"{rid}: {state}, leaving it alone")
    rec = record.update(out, record.keep_cancellations(rec))
    if sweep.spec.prune is not None:
        return prune_submit.submit(args, sweep, out, runs, configs, python, to_submit)
    prune_sweep.clear_pauses(todo)  # without prune, a run paused or pruned earlier trains to its end
    if not todo:
        print(f"nothing to submit: all {len(runs)} runs are completed, queued or running")
        return 0
    code = rec["code"]["path"]
    if args.executor == "slurm":
        from launchers import slurm_executor

        try:
            jobs = slurm_executor.submit(todo, out, sweep.spec.name, code)
        except slurm_executor.SubmitError as err:
            record.record_submission(out, rec, "slurm", err.jobs)
            raise UsageError(str(err)) from None
        record.record_submission(out, rec, "slurm", jobs)
        for rid, job in jobs.items():
            print(f"{rid}: job {job}")
        print(f"submitted {len(jobs)} runs; follow them with: rrtrain status {out}")
        return 0
    ran = run_here(args.executor, todo, python, code, configs, out, args.parallel, sweep.spec.monitor.cancel)
    if ran is None:
        return 130
    jobs, codes = ran
    rec = record.record_submission(out, rec, args.executor, jobs)  # cancellations may have been recorded meanwhile
    stopped = {rid for rid in codes if read_cancelled(Path(rec["runs"][rid]["dir"])) is not None}
    bad = {rid: c for rid, c in codes.items() if c != 0 and rid not in stopped}
    print(f"{len(codes) - len(bad) - len(stopped)} of {len(codes)} runs completed" +
          (f"; cancelled as flagged: {', '.join(sorted(stopped))}" if stopped else "") +
          (f"; not completed: {', '.join(f'{k} (exit {v})' for k, v in bad.items())}" if bad else ""))
    return 1 if bad else 0
