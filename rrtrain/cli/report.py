"""`rrtrain report SWEEP_DIR [--out DIR] ...`: tables, CSV, JSON and plots from a sweep directory.

Variants compared: `--reference` (default `review` when any run is a `review` run, otherwise the
first variant alphabetically) against `--baselines` (default: every other variant present).
Bad input raises `UsageError`; the dispatcher prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from pathlib import Path

from rrtrain.core import files
from rrtrain.core.args import CommandParser
from rrtrain.core.errors import UsageError

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog="rrtrain report",
        description="Welch-t significance tables (the paper's Table 2), the advantage's trend across sizes, "
        "extrapolation, power analysis and plots for every run found under SWEEP_DIR.",
    )
    p.add_argument("sweep_dir", metavar="SWEEP_DIR", help="directory searched (any depth) for final.json / metrics.jsonl")
    p.add_argument("--out", metavar="DIR", help="output directory (default: SWEEP_DIR/report)")
    p.add_argument("--reference", metavar="VARIANT",
                   help="variant the others are compared with (default: review if present, else the first alphabetically)")
    p.add_argument("--baselines", metavar="A,B", help="comma-separated variants (default: every other variant present)")
    p.add_argument("--alpha", default="0.05", metavar="A", help="significance level of the tests (default 0.05)")
    p.add_argument("--power", default="0.8", metavar="P", help="target power for the seed counts (default 0.8)")
    p.add_argument("--effect", metavar="NATS", help="plan the seed counts for this difference instead of the observed one")
    p.add_argument("--extrapolate", metavar="N,N", default="",
                   help="parameter counts to extrapolate the advantage to, e.g. 7e9,7e10 or 7B,70B")
    p.add_argument("--include-flagged", action="store_true",
                   help="keep stalled/diverged/failed or monitor-flagged runs in the means")
    g = p.add_argument_group("sweeps with a grid (each variant at its best setting)")
    g.add_argument("--select-seeds", default="1", metavar="K",
                   help="choose each size and variant's grid point on seeds 0..K-1, test on the seeds >= K (default 1)")
    g.add_argument("--shared", metavar="KEY=VALUE,...",
                   help="the shared setting every variant is also compared at (default: the middle value of each key)")
    g.add_argument("--lr-for", metavar="SIZE,N", default="",
                   help="also suggest a learning rate for these size presets or parameter counts (e.g. rr-1b,7B); "
                   "for a mup/completep sweep, beside the fitted law, the base shape's, which transfers")
    return p


def _fraction(name: str, text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise UsageError(f"{name} must be a number between 0 and 1, got {text!r}") from None
    if not 0.0 < x < 1.0:
        raise UsageError(f"{name} must be between 0 and 1 (exclusive), got {text}")
    return x


def parse_count(text: str) -> float:
    """'7e9', '7B', '70b', '500M', '1.5T' -> a positive parameter count."""
    m = re.fullmatch(r"\s*([0-9.eE+-]+?)\s*([kKmMbBgGtT]?)\s*", text)
    try:
        if m is None:
            raise ValueError
        x = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    except ValueError:
        raise UsageError(f"--extrapolate: {text.strip()!r} is not a parameter count (e.g. 7e9 or 7B)") from None
    if not math.isfinite(x) or x <= 0:
        raise UsageError(f"--extrapolate: {text.strip()!r} must be a positive parameter count")
    return x


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise UsageError(f"--baselines: empty name in {text!r}")
    if len(set(names)) != len(names):
        raise UsageError(f"--baselines: a variant is named twice in {text!r}")
    return names


def options_from(args: argparse.Namespace):
    from rrtrain.report.options import Options

    effect = None
    if args.effect is not None:
        try:
            effect = float(args.effect)
        except ValueError:
            raise UsageError(f"--effect must be a number of nats, got {args.effect!r}") from None
        if not math.isfinite(effect) or effect <= 0:
            raise UsageError(f"--effect must be a positive number of nats, got {args.effect}")
    return Options(
        reference=args.reference,
        baselines=_names(args.baselines) if args.baselines is not None else None,
        alpha=_fraction("--alpha", args.alpha),
        power=_fraction("--power", args.power),
        effect=effect,
        extrapolate=[parse_count(t) for t in args.extrapolate.split(",") if t.strip()],
        include_flagged=args.include_flagged,
        select_seeds=_select_seeds(args.select_seeds),
        shared=args.shared,
        lr_for=[_lr_target(t.strip()) for t in args.lr_for.split(",") if t.strip()],
    )


def _select_seeds(text: str) -> int:
    try:
        k = int(text)
    except ValueError:
        raise UsageError(f"--select-seeds must be a whole number of seeds, got {text!r}") from None
    if k < 1:
        raise UsageError(f"--select-seeds must be at least 1 (selecting on no seed selects nothing), got {k}")
    return k


def _lr_target(text: str) -> tuple[str, float]:
    """`--lr-for`: a size preset (its parameter count, unmatched) or a count such as 7B."""
    from rrtrain.sizing import presets

    if text in presets():
        from rrtrain.report.grid import size_params

        return text, size_params(text)
    try:
        n = parse_count(text)
    except UsageError:
        raise UsageError(f"--lr-for: {text!r} is neither a size preset nor a parameter count (e.g. rr-1b or 7B)") from None
    return text, n


def _linked(out: Path) -> str:
    return (f"--out {str(out)!r} is a symbolic link: the report is written only to a directory of its own; "
            "remove the link or choose another --out")


def refuse_unless_private(out: Path, given: bool) -> None:
    """One line when someone other than the user (or root) can write `out` or a directory on its way: a report
    is written only where no one else can change it, and a sweep directory read as data is not such a place
    (`given`: `out` is --out, else SWEEP_DIR/report)."""
    why = files.private_path_problem(out)
    if why is None:
        return
    if given:
        raise UsageError(f"--out {str(out)!r}: {files.explained(why)}")
    raise UsageError(f"{out} (the report's default place, inside SWEEP_DIR): {why}; rrtrain writes only into "
                     "directories no one else can write: choose a directory of your own with --out DIR")


def output_dir(out: Path, given: bool = True) -> Path:
    """The report's directory (`given`: named by --out), refused unless it is the user's alone, created when
    missing (`files.make_dirs`: private) and opened without following a symbolic link (a
    `SWEEP/report` planted as a link would send the report's files wherever it points); the path returned names
    that opened directory (/proc/self/fd/N), so a swap of `out` for a link afterwards redirects nothing. Every file
    is then written aside in it and renamed into place, which replaces a link at its name rather than writing
    through it."""
    if out.is_symlink():
        raise UsageError(_linked(out))
    refuse_unless_private(out, given)  # before anything is made there
    try:
        files.make_dirs(out)  # the user's alone, whatever the umask
        fd = files.open_dir(out)
    except OSError as err:  # a file on its path, a read-only mount, a link planted meanwhile (ELOOP)
        if out.is_symlink():
            raise UsageError(_linked(out)) from None
        raise UsageError(f"--out {str(out)!r} cannot be created: {err.strerror or type(err).__name__}") from None
    try:
        refuse_unless_private(out, given)  # again, once made: a directory slipped in meanwhile is caught
    except UsageError:
        os.close(fd)
        raise
    held = Path(f"/proc/self/fd/{fd}")
    if held.is_dir():  # Linux: the descriptor's own directory, whatever its name points to later
        return held  # (the descriptor stays open until the command ends)
    os.close(fd)
    return out


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    opts = options_from(args)  # validate every flag before touching the disk
    sweep = Path(args.sweep_dir)
    if not sweep.is_dir():
        raise UsageError(f"SWEEP_DIR {str(sweep)!r} is not a directory")
    out = Path(args.out) if args.out else sweep / "report"
    if out.is_symlink():  # checked again when it is opened
        raise UsageError(_linked(out))
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r} exists and is not a directory")
    refuse_unless_private(out, args.out is not None)  # before the analysis, and again when it is opened

    from rrtrain.report.collect import find_runs
    from rrtrain.report.options import choose_variants

    runs = find_runs(sweep, skip=[out])
    if not runs:
        raise UsageError(f"no runs under {str(sweep)!r} (looked for final.json or metrics.jsonl at any depth)")
    choose_variants(sorted({r.variant for r in runs if r.variant}), opts.reference, opts.baselines)

    # the heavy imports (scipy, matplotlib) only once the input is known to be good
    from rrtrain.core.io import atomic_write_text as write_text
    from rrtrain.report import plots, render
    from rrtrain.report.analysis import analyze
    from rrtrain.report.downstream import with_downstream

    from rrtrain.report import grid

    if grid.has_grid(runs):
        return grid_report(runs, opts, sweep, out, args.out is not None)
    analysis = with_downstream(analyze(runs, opts))
    where = output_dir(out, args.out is not None)
    drawn = plots.write_all(analysis, where)
    write_text(where / "results.csv", render.results_csv(analysis))
    write_text(where / "summary.json", render.summary_json(analysis, drawn, str(sweep)))
    write_text(where / "report.md", render.report_md(analysis, drawn, sweep.resolve().name))
    n_plots = sum("skipped" not in d for d in drawn.values())
    print(f"rrtrain report: {len(runs)} runs ({len(analysis.included)} in the means), reference {analysis.reference}; "
          f"wrote report.md, results.csv, summary.json and {n_plots} plot(s) to {out}")
    return 0


def grid_report(runs: list, opts, sweep: Path, out: Path, given: bool = True) -> int:
    """A sweep with a grid: the grid's section (selection, the two tables, failures, the lr fit) first; the full
    report below it is the one at the selected settings (its means, tests, trend, plots and CSV)."""
    from rrtrain.core.io import atomic_write_text as write_text
    from rrtrain.report import grid, grid_render, plots, render

    from rrtrain.report.downstream import with_downstream

    ga = grid.analyze_grid(runs, opts, sweep)
    with_downstream(ga.selected)  # the downstream tables at the points the loss chose, on the test seeds
    where = output_dir(out, given)
    transfer_plot = plots.write_transfer(ga.transfer, where) if ga.transfer else None
    shown = transfer_plot["file"] if transfer_plot and "skipped" not in transfer_plot else None
    head = grid_render.grid_md(ga, sweep.resolve().name, shown)  # type: ignore[arg-type]
    body, drawn = "", {}
    if ga.selected is not None:
        drawn = plots.write_all(ga.selected, where)
        write_text(where / "results.csv", render.results_csv(ga.selected))
        body = render.report_md(ga.selected, drawn, f"{sweep.resolve().name}, at the selected settings")
    summary = render.summary(ga.selected, drawn, str(sweep)) if ga.selected is not None else {"sweep_dir": str(sweep)}
    summary["grid"] = grid_render.grid_summary(ga)
    if transfer_plot is not None:
        summary["grid"]["transfer_plot"] = transfer_plot
    write_text(where / "summary.json", json.dumps(summary, indent=2, allow_nan=False) + "\n")
    write_text(where / "report.md", head + ("\n" + body if body else ""))
    print(grid_render.grid_text(ga))
    print(f"rrtrain report: {len(runs)} runs of a grid over {', '.join(ga.keys)}; wrote report.md, summary.json"
          + (", results.csv and plots" if ga.selected is not None else "") + f" to {out}")
    return 0
