"""`rrtrain dashboard SWEEP_DIR [--port P] [--refresh S]`: TensorBoard on loopback over one logdir for the whole
sweep, kept live: every `--refresh` seconds the logdir takes what the runs wrote since (`rrtrain.dashboard.live`:
new runs, new steps, flags, changed outcomes), appended, while TensorBoard runs as a child process.

The logdir (`SWEEP_DIR/.dashboard/logdir`, rebuilt at each start and swapped in atomically) holds one run per
run directory, named `SIZE/VARIANT/seedN` (so TensorBoard's run filter takes a size as `^SIZE/`, a variant as
`/VARIANT/`; a run of a grid is `SIZE/VARIANT/POINT/seedN`, POINT as in its id: `lr3e-3`): symlinks to the run's
own event files, plus one event file written here from `metrics.jsonl` (the source of truth) with
- the curves again under per-size tags (`SIZE/train_loss`, `SIZE/val_loss`, `SIZE/grad_norm`,
  `SIZE/gate_mean/BLOCK`), so that a custom-scalars chart per size shows exactly that size's variants;
- the HParams session (variant, size, seed, params, the grid keys -> final and best val loss, number of flags,
  flags), the table showing variant, size and seed by default: a run of its own, `NAME/STATUS`, replaced when
  the outcome changes;
- the monitor's flags: a `flags` text entry (step, reason) and a `SIZE/flags` marker on the train-loss chart;
- a histogram of each gated site's gate values at every diagnostic step (`gates/SITE`, from the trainer's
  `gate_hist` counts).
The `_sweep` pseudo-run holds the custom-scalars layout and the sweep's summary table (text): the `summary`
callable's (`rrtrain dashboard` gives the `rrtrain status` table, `rrtrain.cli.dashboard`), asked at every refresh.
Runs are found by final.json / metrics.jsonl anywhere under the sweep directory, as the report finds them.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from rrtrain.core import files
from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError
from rrtrain.rundir import fields, readers
from rrtrain.rundir.layout import run_dirs
from rrtrain.dashboard import live
from rrtrain.dashboard.live import IDENTITY, SERIES, layout  # noqa: F401  (the names this module always had)
from rrtrain.rundir.points import point_key, read_point

HOST = "127.0.0.1"  # loopback only: on a cluster, reach it through an SSH tunnel
REFRESH_S = 10.0  # the logdir's default refresh interval


#: a size or variant that becomes a directory of the logdir: a plain name, never a path (`..`, `/etc`)
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=@,-]{0,127}")
SAFE_SEED = re.compile(r"seed(-?[0-9]{1,20}|x)")


def run_identity(run: Path) -> tuple[str, str, str, readers.Final]:
    """(size, variant, seedN, final.json, empty while the run goes) from final.json, else config.yaml."""
    final = readers.read_final(run)
    who = readers.identity(final, {} if readers.has_identity(final) else readers.read_config(run))
    seed = who.seed if who.seed is not None else "x"
    return who.size or "unknown", who.variant or run.name, f"seed{seed}", final or readers.Final()


def unsafe_identity(size: str, variant: str, seed: str) -> Optional[str]:
    """Why a run's identity cannot name its logdir directory (None: it can). It was read from the run's files
    (final.json, else config.yaml), which anyone may have written."""
    for key, value, pattern in (("size", size, SAFE_NAME), ("variant", variant, SAFE_NAME), ("seed", seed, SAFE_SEED)):
        if not pattern.fullmatch(value):
            return f"its {key} {fields.short(value)} (final.json or config.yaml) is not a plain name"
    return None


def run_point(run: Path) -> dict[str, Any]:
    """The run's grid point (config.yaml `run.point`; {} without a grid): a part of its name and its HParams."""
    return read_point(readers.read_config(run))


class LiveLogdir:
    """What the dashboard keeps between refreshes: the build directory TensorBoard reads, one feed per run shown
    (`rrtrain.dashboard.live.RunFeed`), the `_sweep` pseudo-run, and the runs skipped (never looked at again)."""

    def __init__(self, sweep: Path, build: Path, summary: Optional[live.Summary] = None) -> None:
        self.sweep, self.build = sweep, build
        self.feeds: dict[Path, live.RunFeed] = {}
        self.names: list[str] = []
        self.skipped: set[Path] = set()
        self.sweep_feed = live.SweepFeed(build / live.SWEEP_RUN, summary)

    def add(self, run: Path, ident: tuple[str, str, str, readers.Final]) -> None:
        size, variant, seed, _ = ident
        point = run_point(run)
        name = f"{size}/{variant}/{point_key(point)}/{seed}" if point else f"{size}/{variant}/{seed}"
        while name in self.names:  # the same identity twice (e.g. a rerun in another directory)
            name += "+"
        self.names.append(name)
        feed = live.RunFeed(run, self.build / name, name, size, variant, seed, point)
        feed.refresh()
        self.feeds[run] = feed

    def refresh(self) -> int:
        """Find the runs that appeared, append what is new for every run; the number of runs that changed."""
        home = self.sweep / ".dashboard"
        added = 0
        for run in run_dirs(self.sweep):
            if run in self.feeds or run in self.skipped or home in run.parents:
                continue
            ident = run_identity(run)
            why = unsafe_identity(*ident[:3])
            if why is not None:
                self.skipped.add(run)
                print(f"rrtrain dashboard: skipping {run}: {why}", file=sys.stderr, flush=True)
                continue
            self.add(run, ident)
            added += 1
        return added + live.refresh_all(list(self.feeds.values()), self.sweep_feed)


def build_logdir(sweep_dir: str | os.PathLike[str], state: Optional[list[LiveLogdir]] = None,
                 summary: Optional[live.Summary] = None) -> tuple[Path, list[str]]:
    """Build the sweep's logdir aside and swap it in with one rename; returns (logdir, run names). `state`:
    a list that receives the `LiveLogdir` the refresher keeps appending to; `summary`: the `_sweep` table's
    source (`rrtrain.dashboard.live.SweepFeed`)."""
    sweep = Path(sweep_dir)
    if not sweep.is_dir():
        raise UsageError(f"{sweep}: not a directory")
    home = sweep / ".dashboard"
    found = [d for d in run_dirs(sweep) if home not in d.parents]
    if not found:
        raise UsageError(f"{sweep}: no runs (no final.json or metrics.jsonl under it)")
    runs, idents = [], []
    for run in found:
        ident = run_identity(run)
        why = unsafe_identity(*ident[:3])
        if why is None:
            runs.append(run)
            idents.append(ident)
        else:
            print(f"rrtrain dashboard: skipping {run}: {why}", file=sys.stderr, flush=True)
    if not runs:
        raise UsageError(f"{sweep}: no run that the dashboard can show (every one was skipped, see above)")
    if home.is_symlink() or (home.exists() and not home.is_dir()):
        raise UsageError(f"{home} is not a directory of its own (a link or a file): move it away")
    home.mkdir(exist_ok=True)
    key = files.directory_key(home)  # the dashboard's own: a later start proves, and deletes, this build
    build = Path(files.make_temp_dir("build-", home, key=key))
    build.chmod(0o755)
    kept = LiveLogdir(sweep, build, summary)
    for run, ident in zip(runs, idents):
        kept.add(run, ident)
    kept.skipped.update(d for d in found if d not in kept.feeds)
    kept.sweep_feed.refresh(list(kept.feeds.values()))
    names = list(kept.names)
    if state is not None:
        state.append(kept)
    link = home / "logdir"
    try:
        old = link.resolve() if link.is_symlink() else None
    except (OSError, RuntimeError):  # a loop of links (RuntimeError on Python 3.11): replaced below, not followed
        print(f"rrtrain dashboard: {link} is a loop of symbolic links; replacing it", file=sys.stderr, flush=True)
        old = None
    files.link_atomically(link, build.name)
    if old is not None and old != build and old.parent == home:
        files.discard_made_dir(old, key=key)  # only a build a start made here, never what a link names
    return link, names


def main(argv: list[str], summary_of: Optional[Callable[[Path], live.Summary]] = None) -> int:
    """`summary_of(SWEEP_DIR)`: the source of the `_sweep` table (`rrtrain.cli.dashboard` gives `rrtrain
    status`'s); None: the table the dashboard builds from its own feeds."""
    parser = CommandParser(prog="rrtrain dashboard", description="TensorBoard on loopback over a sweep's runs")
    parser.add_argument("sweep_dir")
    parser.add_argument("--port", type=int, default=6006)
    parser.add_argument("--refresh", type=float, default=REFRESH_S, metavar="S",
                        help=f"seconds between refreshes of the logdir (default {REFRESH_S:g})")
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    if not 0 < args.refresh <= 24 * 3600:
        raise UsageError(f"--refresh must be a positive number of seconds (at most a day), got {args.refresh}")
    state: list[LiveLogdir] = []
    summary = summary_of(Path(args.sweep_dir)) if summary_of is not None else None
    logdir, names = build_logdir(args.sweep_dir, state, summary)
    print(f"rrtrain dashboard: {len(names)} runs from {args.sweep_dir} at http://{HOST}:{args.port}/ "
          f"(refreshed every {args.refresh:g} s)", flush=True)
    cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", HOST,
           "--port", str(args.port), "--reload_interval", f"{min(args.refresh, 15.0):g}",
           # the derived event files grow beside the runs' own, and TensorBoard reads every one that grows
           "--reload_multifile", "true", "--load_fast", "false"]
    return serve(cmd, state[0], args.refresh)


def serve(cmd: list[str], kept: LiveLogdir, every: float) -> int:
    """Run TensorBoard as a child and refresh the logdir beside it until TensorBoard ends, or this process is
    told to (Ctrl-C, TERM: TensorBoard is stopped too). A refresh that fails (a disk error) is said in one
    line and tried again at the next interval; it never stops TensorBoard."""
    import signal
    import subprocess
    import time

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    child = subprocess.Popen(cmd)
    try:
        while child.poll() is None:
            deadline = time.monotonic() + every
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(min(0.5, every))
            if child.poll() is not None:
                break
            try:
                kept.refresh()
            except OSError as err:
                print(f"rrtrain dashboard: refresh failed ({err}); trying again in {every:g} s",
                      file=sys.stderr, flush=True)
        return child.returncode
    except KeyboardInterrupt:
        return 0
    finally:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
