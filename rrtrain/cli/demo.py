"""`rrtrain demo [--out DIR] [--executor local|slurm] [--parallel N] [key=value ...]`: the embedded default.

Runs `configs/sweeps/demo.yaml` through `rrtrain sweep`, the same code path as a cluster sweep:
`standard`, `highway` and `review` (the baselines parameter-matched to review) at two tiny sizes with two
seeds each, and `review` against `review_convex` at 40 sublayers, where the convergence monitor stops the
convex run as stalled while it happens (`monitor.on_stall: stop`). The sweep prepares its data (the built-in
synthetic stories, byte-level) into DIR/data when it is missing.

While it runs, a progress line every few seconds: runs done / total, the running runs' step and loss, and an
estimate of the time left (from `rrtrain status`'s reading of the run directories). At the end: the report's
table (`rrtrain report`), the flagged runs with their reasons, where the plots and the TensorBoard logdir
are, and the `rrtrain dashboard` command.

  local   runs on this machine, --parallel at a time (default: one per CPU core)
  slurm   the same sweep submitted to Slurm (slurm/local/start.sh starts a one-node cluster); the demo
          waits for the jobs and follows them the same way

Trailing `key.sub=value` arguments override the sweep file's keys, as for `rrtrain sweep`, e.g.
`sizes.tiny.seeds=3`. Re-running skips finished runs and resumes unfinished ones.
Exit status: 0 when every run completed or was stopped by the monitor, 1 when a run failed, 2 for bad input.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from rrtrain.core import files
from rrtrain.core.args import CommandParser
from rrtrain.core.child_python import MODULE_AT, child_env, module_argv
from rrtrain.core.errors import UsageError
from rrtrain.sizing import configs_dir

if TYPE_CHECKING:
    from launchers.state.cache import StatusCache

#: run states that mean the run will not train any further in this sweep submission
ENDED = ("completed", "stalled", "diverged", "failed", "preempted", "unknown")
#: states a run may end in without the demo having failed: the monitor stopped it, by design
STOPPED_BY_MONITOR = ("stalled", "diverged")


def parse(argv: list[str]) -> argparse.Namespace:
    p = CommandParser(prog="rrtrain demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/demo", help="the sweep directory (default runs/demo)")
    p.add_argument("--executor", choices=["local", "slurm"], default="local")
    p.add_argument("--parallel", type=int, default=os.cpu_count() or 1,
                   help="local: runs at a time (default: the number of CPU cores)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between progress lines (default 5)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override the sweep file's keys")
    return p.parse_intermixed_args(argv)


def sweep_file() -> Path:
    return configs_dir() / "sweeps" / "demo.yaml"


def sweep_command(args: argparse.Namespace, out: Path) -> list[str]:
    """The `rrtrain sweep` command line the demo runs."""
    local = ["--parallel", str(args.parallel)] if args.executor == "local" else []
    return module_argv("rrtrain", "sweep", str(sweep_file()), "--out", str(out), "--executor", args.executor,
                       *local, *args.overrides)


def read_status(out: Path, cache: Optional[StatusCache] = None) -> Optional[dict[str, Any]]:
    """`rrtrain status --json`'s object, or None before the sweep has written sweep.json. `cache`: what earlier
    polls read (as `rrtrain status --watch` keeps it), so that a poll reads only what changed since."""
    from launchers.state import status as sweep_status

    if not (out / "sweep.json").exists():
        return None
    return sweep_status.collect(out, cache)


def step_costs(out: Path) -> dict[str, float]:
    """Training FLOPs per step of every run (from its resolved config), so that the time left weighs a
    40-sublayer run's step above a 2-block one's; empty when a config cannot be read."""
    from launchers.sweep import record
    from rrtrain.config import Config
    from rrtrain.config_load import build
    from rrtrain.data.manifest import prepared_manifest
    from rrtrain.resolve import resolve

    rec = record.load(out)
    costs: dict[str, float] = {}
    try:
        for rid, entry in (rec.runs if rec is not None else {}).items():
            cfg = build(Config, entry.config)
            run = resolve(cfg, prepared_manifest(cfg.data.path))
            costs[rid] = run.flops_per_token * cfg.train.global_batch
    except (UsageError, KeyError, TypeError, OSError, ValueError):
        return {}
    return costs


def fraction_done(rows: list[dict[str, Any]], costs: dict[str, float]) -> Optional[float]:
    """The share of the sweep's work that is behind it, in training FLOPs (steps when they are unknown): an
    ended run counts whole (a stopped run's remaining steps will never be spent)."""
    total = done = 0.0
    for r in rows:
        steps = r["total_steps"]
        if not steps:
            return None
        weight = costs.get(r["id"], 1.0)
        total += weight * steps
        done += weight * (steps if r["state"] in ENDED else min(r["step"] or 0, steps))
    return done / total if total else None


def progress_line(status: dict[str, Any], elapsed: float, costs: dict[str, float]) -> str:
    rows = status["runs"]
    ended = sum(r["state"] in ENDED for r in rows)
    running = [r for r in rows if r["state"] == "running"]
    frac = fraction_done(rows, costs)
    eta = f"{elapsed * (1 - frac) / frac:.0f} s" if frac and frac < 1 else "-"
    parts = [f"{r['id']} {r['step'] or 0}/{r['total_steps']}" +
             (f" loss {r['loss']:.3f}" if isinstance(r["loss"], (int, float)) else "") for r in running]
    return (f"[{elapsed:5.0f} s] runs done {ended}/{len(rows)}, time left ~{eta}"
            + (": " + ", ".join(parts) if parts else ""))


def follow(proc: subprocess.Popen, out: Path, interval: float, wait_for_runs: bool) -> dict[str, Any]:
    """Print progress until the sweep command has ended and, for Slurm (whose `rrtrain sweep` returns once
    queued), until every run has ended; returns the last status."""
    from launchers.state.cache import StatusCache

    start, last = time.time(), ""
    status: Optional[dict[str, Any]] = None
    costs: dict[str, float] = {}
    cache = StatusCache()  # every run's config and verdict parsed again only when its files change
    while True:
        ended = proc.poll() is not None
        status = read_status(out, cache)
        if status is not None:
            if not costs:
                costs = step_costs(out)
                start = time.time()  # the time left is measured from here, after the data prep
            line = progress_line(status, time.time() - start, costs)
            if line.split("] ", 1)[1] != last:
                print(line, flush=True)
                last = line.split("] ", 1)[1]
        if ended and (not wait_for_runs or proc.returncode != 0 or
                      (status is not None and all(r["state"] in ENDED for r in status["runs"]))):
            break
        time.sleep(interval)
    if status is None:
        lines = files.tail_text(out / "sweep.log").strip().splitlines()
        raise UsageError(f"rrtrain sweep ended (exit {proc.returncode}) before submitting anything: "
                         f"{lines[-1] if lines else 'no output'}")
    return status


def report_table(report_md: Path) -> str:
    """The first table of report.md (the Welch-t comparison per size) with its heading."""
    lines = files.read_text(report_md, "report").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return "(report.md has no table)"
    heading = next((lines[i] for i in range(start - 1, -1, -1) if lines[i].startswith("#")), "")
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(([heading] if heading else []) + lines[start:end])


def summarize(out: Path, status: dict[str, Any]) -> None:
    """The report's table, the flagged runs (`rrtrain status`'s flags: the runs' own and the sweep-level ones)
    with their reasons, where the plots and the TensorBoard logdir are."""
    from rrtrain.cli import report as report_cli
    from rrtrain.dashboard.tensorboard import build_logdir

    report = out / "report"
    report_cli.main([str(out), "--out", str(report)])
    print(f"\n{report_table(report / 'report.md')}")
    print(f"\n(full report: {report / 'report.md'}; per-run rows: {report / 'results.csv'})")
    flagged = [r for r in status["runs"] if r["flags"]]
    print("\nflagged runs:" if flagged else "\nflagged runs: none")
    for r in flagged:
        print(f"  {r['id']} [{r['state']}]")
        for name in r["flags"]:
            print(f"    {name}: {r['flag_details'].get(name, '(no reason recorded)')}")
    plots = sorted(report.glob("*.png"))
    print(f"\nplots ({len(plots)}): {', '.join(str(p) for p in plots)}")
    logdir, names = build_logdir(out)
    print(f"TensorBoard logdir ({len(names)} runs): {logdir}")
    print(f"open the dashboard: rrtrain dashboard {out}")
    print(f"the sweep's table: rrtrain status {out}")


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.parallel < 1:
        raise UsageError(f"--parallel must be at least 1, got {args.parallel}")
    if args.interval <= 0:
        raise UsageError(f"--interval must be positive, got {args.interval}")
    out = Path(args.out).resolve()
    from rrtrain.core.io import unwritable_reason

    why = unwritable_reason(out)  # creates it; a file in the way is one line, not a traceback
    if why is not None:
        raise UsageError(f"--out {args.out!r} cannot be written: {why}")
    cmd = sweep_command(args, out)
    log_path = out / "sweep.log"
    print(f"rrtrain demo: {shlex.join(cmd[MODULE_AT:])}\n  (its output: {log_path})", flush=True)
    t0 = time.time()
    try:
        log = files.open_append(log_path)  # never through a link planted at OUT/sweep.log, never to a FIFO
    except OSError as err:
        raise UsageError(f"{log_path} cannot be appended to: {err.strerror or type(err).__name__}") from None
    with log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env())
        try:
            status = follow(proc, out, args.interval, wait_for_runs=args.executor == "slurm")
        except KeyboardInterrupt:
            proc.wait()  # the sweep got the same interrupt: its runs checkpoint and stop
            print(f"\ninterrupted: run `rrtrain demo --out {args.out}` again to resume")
            return 130
    if proc.returncode not in (0, 1):  # 1: a run did not complete, which the stalled convex run is meant to do
        tail = files.tail_text(log_path).strip().splitlines()[-1:]
        if proc.returncode == 2:
            raise UsageError(f"rrtrain sweep refused: {tail[0] if tail else '(no output)'}")
        print(f"rrtrain demo: rrtrain sweep failed with exit status {proc.returncode}; see {log_path}")
        return 1
    status = read_status(out) or status  # the runs' final state, with the sweep-level flags
    failed = [r["id"] for r in status["runs"] if r["state"] not in ("completed",) + STOPPED_BY_MONITOR]
    print(f"\nrrtrain demo: sweep done in {time.time() - t0:.0f} s: " +
          ", ".join(f"{n} {s}" for s, n in status["counts"].items()), flush=True)
    summarize(out, status)
    if failed:
        print(f"rrtrain demo: runs that did not end well: {', '.join(failed)} (logs in {out / 'slurm' / 'logs'})")
        return 1
    return 0
