"""`rrtrain sweep`'s submission, under the sweep's lock: the record merged, the runs that need submitting
(`to_submit`), the data prepared, the code snapshot taken, the configs and sbatch scripts written, then the
runs handed to the executor. With `prune:`, passes of successive halving (`launchers.prune.rule`): each pass
observes the runs, ranks every group that reached its rung, marks the worst `pruned`, and submits the runs that
go on, each with the step it pauses at (`pause.json`). The local and debug executors pass until no run can go
on (every group ended, or waits for a run that failed in this command); Slurm submits one pass and returns:
run `rrtrain sweep` again once the runs paused (`rrtrain status` shows them) to take the next rung. No process
has to stay alive between rungs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Optional

import yaml

from launchers.executors.entry import config_path
from launchers.executors.here import run_here
from launchers.executors.render import render
from launchers.prune import rungs as prune_sweep
from launchers.state import runstate
from launchers.state.scheduler import squeue_states
from launchers.sweep import record, snapshot
from launchers.sweep.estimate import cost, grid_costs
from launchers.sweep.expand import Run, check_safe
from launchers.sweep.spec import Sweep
from rrtrain.core.errors import UsageError
from rrtrain.core.io import atomic_write_text
from rrtrain.rundir.outcome import EXIT_CODES
from rrtrain.rundir.readers import read_cancelled, read_final

PAUSED_EXIT = EXIT_CODES["paused"]


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


def prepare_data(sweep: Sweep, out: Path, dry_run: bool) -> None:
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


def print_plan(sweep: Sweep, runs: list[Run], todo: list[Run], skipped: dict[str, str]) -> None:
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


def submit(args: argparse.Namespace, sweep: Sweep, out: Path, runs: list[Run], rungs: list[str]) -> int:
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
        return submit_pruned(args, sweep, out, runs, configs, python)
    prune_sweep.clear_pauses(todo)  # without prune, a run paused or pruned earlier trains to its end
    if not todo:
        print(f"nothing to submit: all {len(runs)} runs are completed, queued or running")
        return 0
    code = rec["code"]["path"]
    if args.executor == "slurm":
        from launchers.executors import slurm as slurm_executor

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


def submit_pruned(args: argparse.Namespace, sweep: Sweep, out: Path, runs: list[Run], configs: dict[str, Path],
                  python: str) -> int:
    """Pass until no run can go on (local, debug) or once (slurm); print the decisions and what pruning saved."""
    p = sweep.spec.prune
    assert p is not None
    failed: set[str] = set()
    sent: set[tuple[str, object]] = set()
    bad: dict[str, int] = {}
    shown: set[str] = set()  # the decisions printed already (every pass decides the earlier rungs again, alike)
    code = 0
    while True:
        todo, skipped = to_submit(runs, record.load(out))
        result = prune_sweep.carry_out(out, p, runs, skipped, exclude=frozenset(failed))
        for line in prune_sweep.describe(result):
            if line not in shown:
                print(line)
                shown.add(line)
        for rid, rung in result.prune.items():
            print(f"{rid}: pruned at {rung['why']}")
        again = [rid for rid, step in result.go.items() if (rid, step) in sent]
        for rid in again:  # sent to this step before in this command and not past it: do not loop on it
            print(f"{rid}: did not reach step {result.go[rid]} when sent there; not sent again")
            failed.add(rid)
            result.go.pop(rid)
        go = [r for r in runs if r.id in result.go]
        if not go:
            break
        sent |= set(result.go.items())
        print(f"pruning pass: {len(go)} run(s) to go on: " + ", ".join(
            f"{r.id} to {'its end' if result.go[r.id] is None else f'step {result.go[r.id]}'}" for r in go),
            flush=True)
        rec = record.load(out)
        if args.executor == "slurm":
            submit_slurm(go, out, sweep, rec)
            break
        ran = run_here(args.executor, go, python, rec["code"]["path"], configs, out, args.parallel,
                       sweep.spec.monitor.cancel)
        if ran is None:
            return 130
        jobs, codes = ran
        rec = record.record_submission(out, rec, args.executor, jobs)  # cancellations may have been recorded meanwhile
        for rid, c in codes.items():
            bad.pop(rid, None)
            if c not in (0, PAUSED_EXIT):
                failed.add(rid)
                if read_cancelled(Path(rec["runs"][rid]["dir"])) is None:
                    bad[rid] = c
    saved = prune_sweep.savings(out, runs, lambda r: cost(r, sweep.spec.gpu, sweep.spec.mfu))
    states = Counter((read_final(r.dir).status if read_final(r.dir) else "not ended") for r in runs)
    print("runs: " + ", ".join(f"{s}: {n}" for s, n in sorted(states.items())))
    print(prune_sweep.saved_line(saved))
    if args.executor != "slurm" and bad:
        print("not completed: " + ", ".join(f"{k} (exit {v})" for k, v in sorted(bad.items())))
        code = 1
    return code


def submit_slurm(go: list[Run], out: Path, sweep: Sweep, rec: dict) -> None:
    from launchers.executors import slurm as slurm_executor

    try:
        jobs = slurm_executor.submit(go, out, sweep.spec.name, rec["code"]["path"])
    except slurm_executor.SubmitError as err:
        record.record_submission(out, rec, "slurm", err.jobs)
        raise UsageError(str(err)) from None
    record.record_submission(out, rec, "slurm", jobs)
    for rid, job in jobs.items():
        print(f"{rid}: job {job}")
    print(f"submitted {len(jobs)} runs; when they have paused or ended (rrtrain status {out}), run this command "
          "again to rank them and take the next rung")
