"""`rrtrain sweep` for a sweep with `prune:`: passes of successive halving (`launchers.prune`).

Each pass observes the runs, ranks every group that reached its rung, marks the worst `pruned`, and submits the
runs that go on, each with the step it pauses at (`pause.json`). The local and debug executors pass until no
run can go on (every group ended, or waits for a run that failed in this command); Slurm submits one pass and
returns: run `rrtrain sweep` again once the runs paused (`rrtrain status` shows them) to take the next rung.
No process has to stay alive between rungs.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

from launchers import prune_sweep, record
from launchers.run_here import run_here
from launchers.estimate import cost
from launchers.expand import Run
from launchers.spec import PruneSpec, Sweep
from rrtrain.core.errors import UsageError
from rrtrain.rundir.outcome import EXIT_CODES
from rrtrain.rundir.readers import read_cancelled, read_final

PAUSED_EXIT = EXIT_CODES["paused"]


def rung_lines(p: PruneSpec, runs: list[Run]) -> list[str]:
    """For --dry-run: where the rungs fall (refuses rungs that cannot be placed, like the sweep itself)."""
    by_steps: dict[tuple, list[str]] = {}
    for m in prune_sweep.members(p, runs):
        by_steps.setdefault((m.rungs, m.total), []).append(m.id)
    lines = [f"prune: keep {p.keep:g} of each (size, variant)'s points at each rung, by {p.metric} "
             f"(mean of the last {prune_sweep.smooth(p)})"]
    for (rungs, total), ids in by_steps.items():
        lines.append(f"prune: rungs at steps {', '.join(map(str, rungs))} of {total} for {len(ids)} run(s)")
    return lines


#: `launchers.sweep_cli.to_submit`: the runs to submit and the state of every other, from the record
ToSubmit = Callable[[list[Run], Optional[dict]], tuple[list[Run], dict[str, str]]]


def submit(args: argparse.Namespace, sweep: Sweep, out: Path, runs: list[Run], configs: dict[str, Path],
           python: str, to_submit: ToSubmit) -> int:
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
    from launchers import slurm_executor

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
