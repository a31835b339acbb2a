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
from pathlib import Path
from typing import Optional

from launchers import cancel, submit
from launchers.prune import rungs
from launchers.sweep import lock as sweep_lock
from launchers.sweep import record, spec
from launchers.sweep.estimate import check_gpu
from launchers.sweep.expand import check_safe, data_path, expand
from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError
from rrtrain.core.io import unwritable_reason


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
                   help="cancel the jobs of the sweep directory's stalled and diverged runs, recording why (a "
                        "sweep directory no one else can write, else refused)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override the sweep file's keys")
    return p.parse_intermixed_args(argv)


def sweep_dir(sweep: spec.Sweep, out: Optional[str]) -> Path:
    if out is None and sweep.spec.out is None:
        raise UsageError("no sweep directory: pass --out DIR (or set `out:` in the sweep file)")
    p = Path(out) if out is not None else Path(sweep.spec.out).expanduser()
    if out is None and not p.is_absolute():
        p = sweep.path.parent / p
    try:
        resolved = p.resolve()
    except (OSError, RuntimeError):  # a loop of symbolic links (RuntimeError on Python 3.11, OSError later)
        raise UsageError(f"sweep directory {p}: a loop of symbolic links") from None
    return Path(check_safe(str(resolved), "sweep directory"))


def check_writable(out: Path) -> None:
    """A file in the way, a read-only mount: one line now, not a traceback later (creates `out`)."""
    why = unwritable_reason(out)
    if why is not None:
        raise UsageError(f"sweep directory {out} cannot be written: {why}")


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
    lines = rungs.rung_lines(sweep.spec.prune, runs) if sweep.spec.prune is not None else []
    check_writable(out)
    with sweep_lock.hold_sweep(out, args.lock_wait):  # one submission at a time (launchers.sweep.lock)
        return submit.submit(sweep, out, runs, lines, args.executor, args.parallel, args.dry_run)
