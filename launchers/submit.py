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

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

import yaml

from launchers import cancel
from launchers.executors.base import Executor, Interrupted, SubmitError
from launchers.executors.debug import DebugExecutor
from launchers.executors.entry import config_path
from launchers.executors.local import LocalExecutor
from launchers.executors.render import render
from launchers.prune import rungs as prune_rungs
from launchers.state import runstate
from launchers.state.status import run_rows
from launchers.sweep import record, snapshot
from launchers.sweep.estimate import cost, grid_costs
from launchers.sweep.expand import Run, check_safe
from launchers.sweep.spec import Sweep
from data_prep.options import PrepOptions, command
from rrtrain.core.child_python import MODULE_AT, child_env
from rrtrain.core.errors import UsageError
from rrtrain.core.io import atomic_write_text
from rrtrain.rundir.outcome import EXIT_CODES
from rrtrain.rundir.readers import read_cancelled, read_final

PAUSED_EXIT = EXIT_CODES["paused"]


def to_submit(runs: list[Run], rec: Optional[record.SweepRecord]) -> tuple[list[Run], dict[str, str]]:
    """The runs that need submitting, and the state of every run that does not (read as `rrtrain status` reads
    them: `launchers.state.status.run_rows`)."""
    if rec is None:
        return list(runs), {}
    rows = run_rows(rec, {run.id: record.RunEntry.of_run(run) for run in runs}, need_queue=(
        "this sweep has Slurm jobs, and squeue cannot be read here: run `rrtrain sweep` where squeue works, so "
        "that queued runs are not submitted twice"))
    todo, skipped = [], {}
    for run in runs:
        row = rows[run.id]
        state = row["state"]
        if state in runstate.FINISHED or state == "running" or (state == "pending" and row["scheduler"] is not None):
            skipped[run.id] = state
        else:
            todo.append(run)
    return todo, skipped


def prepare_data(sweep: Sweep, out: Path, dry_run: bool, executor: str = "local") -> None:
    """`prep:` sweeps prepare their data once, into DIR/data, before anything is submitted; with `prep.tasks` > 1
    in that many array tasks of the sweep's executor (`rrtrain prep --executor --tasks`: the same dataset)."""
    p = sweep.spec.prep
    if p is None or (out / "data" / "manifest.json").exists():
        return
    cmd = command(PrepOptions.given(p.source, str(out / "data"), tokenizer=p.tokenizer, seq_len=p.seq_len,
                                    seed=p.seed, num_docs=p.num_docs, val_fraction=p.val_fraction, bos=p.bos,
                                    bos_token=p.bos_token))
    if p.tasks > 1:
        cmd += ["--executor", "slurm" if executor == "slurm" else "local", "--tasks", str(p.tasks)]
        if executor == "slurm" and sweep.spec.resources.partition:
            cmd += ["--partition", sweep.spec.resources.partition]
    if dry_run:
        print(f"would prepare the data: -m {' '.join(cmd[MODULE_AT:])}")
        return
    print(f"preparing the data: {out / 'data'}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env())
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
          f"{sweep.spec.mfu:.0%} MFU on {sweep.spec.gpu.upper()}: {total:,.1f}")


def submit(sweep: Sweep, out: Path, runs: list[Run], rungs: list[str], executor: str, parallel: int = 1,
           dry_run: bool = False) -> int:
    """Everything from reading sweep.json to the last job id recorded, with the executor named `executor`
    (`--executor`; `parallel`: the local one's runs at a time), or with `dry_run` up to the sbatch scripts, rendered
    then only (`rungs`: the lines that say where the rungs fall); the caller holds the sweep's lock."""
    old = record.load(out)
    rec = record.merge(old, sweep, runs)  # refuses a changed run before anything is written
    todo, skipped = to_submit(runs, old)
    python = check_safe(sys.executable, "python path")

    prepare_data(sweep, out, dry_run, executor)
    rec.code = snapshot.take(out, rec.code)
    configs = {r.id: config_path(out, r.id) for r in runs}
    for r in runs:
        atomic_write_text(configs[r.id], yaml.safe_dump(r.config, sort_keys=False))
    if dry_run:  # the sbatch scripts are for a cluster where submitit cannot run; no executor reads them
        scripts = render(out, sweep.spec.name, runs, python, rec.code["path"], configs)
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
    record.update(out, record.keep_cancellations(rec))
    poll = (lambda: cancel.cancel_flagged(out)) if sweep.spec.monitor.cancel else None
    return submit_loop(executor_for(executor, python, parallel, poll), sweep, out, runs)


def executor_for(kind: str, python: str, parallel: int, on_poll: Optional[Callable[[], object]]) -> Executor:
    """The executor `--executor` names; the local one calls `on_poll` (the cancellation of flagged runs, with
    `monitor: {cancel: true}`) while it waits."""
    if kind == "slurm":
        from launchers.executors.slurm import SlurmExecutor

        return SlurmExecutor()
    if kind == "local":
        return LocalExecutor(python, parallel, on_poll)
    return DebugExecutor()


def submit_loop(executor: Executor, sweep: Sweep, out: Path, runs: list[Run]) -> int:
    """Pass until no run can go on: each pass decides which runs go on, and to which step (`plan_pass`), and
    hands them to the executor. A plain sweep is a pruned sweep with no rungs: one pass, every run that needs
    it to its end. An executor that does not wait (slurm) submits one pass and returns: `rrtrain sweep` again
    takes the next rung. Prints what happened; returns the command's exit status."""
    passes = Passes(sweep, out, runs)
    codes: dict[str, int] = {}  # each run's last exit status in this command (an executor that waits)
    while True:
        go = passes.next()
        if not go:
            break
        rec = record.load(out)
        try:
            done = executor.submit(go, out, sweep.spec.name, rec.code["path"])
        except SubmitError as err:
            record.record_submission(out, rec, executor.name, err.jobs)
            raise UsageError(str(err)) from None
        except Interrupted:
            return 130
        record.record_submission(out, rec, executor.name, done.jobs)  # cancellations may have been recorded meanwhile
        if not executor.waits:
            for rid, job in done.jobs.items():
                print(f"{rid}: job {job}")
            print(f"submitted {len(done.jobs)} runs; " + (
                f"when they have paused or ended (rrtrain status {out}), run this command again to rank them and "
                "take the next rung" if sweep.spec.prune is not None else f"follow them with: rrtrain status {out}"))
            break
        codes.update(done.codes)
        passes.ended(done.codes)
    return passes.summary(codes, executor.waits)


class Passes:
    """Which runs go on at each pass of `submit_loop`. Without `prune:` there are no rungs: the first pass sends
    every run that needs it to its end, and there is no second. With rungs, each pass ranks the groups that
    reached a rung (`launchers.prune.rungs.carry_out`: pause requests written, the worst marked pruned)."""

    def __init__(self, sweep: Sweep, out: Path, runs: list[Run]) -> None:
        self.sweep, self.out, self.runs = sweep, out, runs
        self.passes = 0
        self.failed: set[str] = set()  # ended badly in this command: not sent again
        self.sent: set[tuple[str, Optional[int]]] = set()
        self.shown: set[str] = set()  # the decisions printed already (every pass decides the earlier rungs again)

    def next(self) -> list[Run]:
        """The runs to submit now (none: the loop ends)."""
        self.passes += 1
        todo, skipped = to_submit(self.runs, record.load(self.out))
        p = self.sweep.spec.prune
        if p is None:
            if self.passes > 1:
                return []
            prune_rungs.clear_pauses(todo)  # without prune, a run paused or pruned earlier trains to its end
            if not todo:
                print(f"nothing to submit: all {len(self.runs)} runs are completed, queued or running")
            return todo
        result = prune_rungs.carry_out(self.out, p, self.runs, skipped, exclude=frozenset(self.failed))
        for line in prune_rungs.describe(result):
            if line not in self.shown:
                print(line)
                self.shown.add(line)
        for rid, rung in result.prune.items():
            print(f"{rid}: pruned at {rung['why']}")
        for rid in [rid for rid, step in result.go.items() if (rid, step) in self.sent]:
            # sent to this step before in this command and not past it: do not loop on it
            print(f"{rid}: did not reach step {result.go[rid]} when sent there; not sent again")
            self.failed.add(rid)
            result.go.pop(rid)
        go = [r for r in self.runs if r.id in result.go]
        if go:
            self.sent |= set(result.go.items())
            print(f"pruning pass: {len(go)} run(s) to go on: " + ", ".join(
                f"{r.id} to {'its end' if result.go[r.id] is None else f'step {result.go[r.id]}'}" for r in go),
                flush=True)
        return go

    def ended(self, codes: dict[str, int]) -> None:
        """The exit status of each run of a pass that the executor waited for."""
        self.failed |= {rid for rid, c in codes.items() if c not in (0, PAUSED_EXIT)}

    def summary(self, codes: dict[str, int], waited: bool) -> int:
        """Print how the runs went (and, with prune, what pruning saved); the command's exit status."""
        dirs = {r.id: r.dir for r in self.runs}
        stopped = {rid for rid in codes if read_cancelled(dirs[rid]) is not None}  # cancelled as flagged
        if self.sweep.spec.prune is None:
            bad = {rid: c for rid, c in codes.items() if c != 0 and rid not in stopped}
            if codes:
                print(f"{len(codes) - len(bad) - len(stopped)} of {len(codes)} runs completed" +
                      (f"; cancelled as flagged: {', '.join(sorted(stopped))}" if stopped else "") +
                      (f"; not completed: {', '.join(f'{k} (exit {v})' for k, v in bad.items())}" if bad else ""))
            return 1 if bad else 0
        spec = self.sweep.spec
        saved = prune_rungs.savings(self.out, self.runs, lambda r: cost(r, spec.gpu, spec.mfu))
        states = Counter((read_final(r.dir).status if read_final(r.dir) else "not ended") for r in self.runs)
        print("runs: " + ", ".join(f"{s}: {n}" for s, n in sorted(states.items())))
        print(prune_rungs.saved_line(saved))
        bad = {rid: c for rid, c in codes.items() if c not in (0, PAUSED_EXIT) and rid not in stopped}
        if waited and bad:
            print("not completed: " + ", ".join(f"{k} (exit {v})" for k, v in sorted(bad.items())))
            return 1
        return 0
