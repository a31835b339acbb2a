"""`rrtrain dashboard SWEEP_DIR [--port P] [--refresh S]`: TensorBoard on loopback over one logdir for the whole
sweep, kept live: every `--refresh` seconds the logdir takes what the runs wrote since (`rrtrain.dashboard.live`:
new runs, new steps, flags, changed outcomes), appended, while TensorBoard runs as a child process.

The logdir (`SWEEP_DIR/.dashboard/logdir` in a sweep directory of the user's alone, else a private directory of
this invocation under $TMPDIR, removed at its end: `state_home`; rebuilt at each start and swapped in atomically;
all of it 0700 / 0600) holds one run per
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
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

from rrtrain.core import files
from rrtrain.core.args import CommandParser
from rrtrain.core.child_python import child_env, module_argv
from rrtrain.core.errors import UsageError
from rrtrain.rundir import fields, readers
from rrtrain.rundir.layout import run_dirs
from rrtrain.dashboard import live
from rrtrain.dashboard.live import IDENTITY, SERIES, layout  # noqa: F401  (the names this module always had)
from rrtrain.rundir.points import point_key, read_point

HOST = "127.0.0.1"  # loopback only: on a cluster, reach it through an SSH tunnel
STATE_DIR = ".dashboard"  # the dashboard's own state in a sweep of the user's own (`state_home`)
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

    def __init__(self, sweep: Path, build: Path, summary: Optional[live.Summary] = None,
                 scratch: Optional[Path] = None) -> None:
        self.sweep, self.build = sweep, build
        self.scratch = scratch  # the per-invocation state directory to remove at the end (`state_home`), if any
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
        home = self.sweep / STATE_DIR
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


def state_home(sweep: Path) -> tuple[Path, bool]:
    """Where the dashboard keeps its own state (its builds of the logdir, their key, the `logdir` link), and
    whether that is a directory of this invocation alone (removed when the dashboard ends). `SWEEP/.dashboard`
    (made `dir_mode()`) when the sweep is the user's alone (`files.private_path_problem`): no one else can plant
    or swap anything there, a later start reuses it and `tensorboard --logdir SWEEP/.dashboard/logdir` works
    after (the demo prints it). Otherwise (another user's sweep, a shared group-writable one) a fresh private
    directory (`tempfile.mkdtemp` under $TMPDIR, 0700): a read-only command writes nothing into a directory
    others can write, and never reads its state from there (a link planted at `.dashboard/logdir` would show
    another directory's runs). UsageError, one line, when neither is private."""
    if files.private_path_problem(sweep) is None:
        home = sweep / STATE_DIR
        if home.is_symlink() or (home.exists() and not home.is_dir()):
            raise UsageError(f"{home} is not a directory of its own (a link or a file): move it away")
        why = files.prepare_private_dir(home)
        if why is not None:
            raise UsageError(f"the dashboard's directory {home}: {files.explained(why)}")
        return home, False
    home = Path(files.make_temp_dir("rrtrain-dashboard-", tempfile.gettempdir()))
    files.check_private_path(home, f"the dashboard's directory {home} ($TMPDIR)")
    return home, True


def build_logdir(sweep_dir: str | os.PathLike[str], state: Optional[list[LiveLogdir]] = None,
                 summary: Optional[live.Summary] = None) -> tuple[Path, list[str]]:
    """Build the sweep's logdir aside, in the dashboard's own private directory (`state_home`), and swap it in
    with one rename; returns (logdir, run names). `state`: a list that receives the `LiveLogdir` the refresher
    keeps appending to; `summary`: the `_sweep` table's source (`rrtrain.dashboard.live.SweepFeed`)."""
    sweep = Path(sweep_dir)
    if not sweep.is_dir():
        raise UsageError(f"{sweep}: not a directory")
    skip = sweep / STATE_DIR
    found = [d for d in run_dirs(sweep) if skip not in d.parents]
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
    home, scratch = state_home(sweep)
    # the dashboard's own: a later start proves, and deletes, this build (a scratch directory: this process's key)
    key = None if scratch else files.directory_key(home)
    build = Path(files.make_temp_dir("build-", home, key=key))  # dir_mode(): 0700
    kept = LiveLogdir(sweep, build, summary, home if scratch else None)
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
    if old is not None and old != build and old.parent == Path(os.path.realpath(home)):
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
    logdir = Path(os.path.realpath(state[0].build))  # TensorBoard reads this private build itself, no name on the way
    print(f"rrtrain dashboard: {len(names)} runs from {args.sweep_dir} at http://{HOST}:{args.port}/ "
          f"(refreshed every {args.refresh:g} s)", flush=True)
    cmd = module_argv("tensorboard.main", "--logdir", str(logdir), "--host", HOST,
                      "--port", str(args.port), "--reload_interval", f"{min(args.refresh, 15.0):g}",
                      # the derived event files grow beside the runs' own, and TensorBoard reads every one that grows
                      "--reload_multifile", "true", "--load_fast", "false")
    try:
        return serve(cmd, state[0], args.refresh)
    finally:
        if state[0].scratch is not None:  # this invocation's own state directory (`state_home`)
            why = files.discard_made_dir(state[0].scratch, [args.sweep_dir])
            if why is not None:
                print(f"rrtrain dashboard: {why}", file=sys.stderr, flush=True)


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
    # TensorBoard writes $TMPDIR/.tensorboard-info/pid-N.info through any link at that name, in a directory it
    # makes 0777 without the sticky bit: in a shared /tmp anyone could point it at a file of the user's. Its
    # $TMPDIR is a private directory of this invocation instead, removed when it ends.
    tb_tmp = files.make_temp_dir("rrtrain-tensorboard-", tempfile.gettempdir())
    child = subprocess.Popen(cmd, env={**child_env(), "TMPDIR": tb_tmp})  # nothing imported from the current dir
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
                child.wait()
        why = files.discard_made_dir(tb_tmp, [])
        if why is not None:
            print(f"rrtrain dashboard: {why}", file=sys.stderr, flush=True)
