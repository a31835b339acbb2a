"""The report's figures, drawn on bare `Figure` objects (Agg canvas; no pyplot global state), in matplotlib's own
style whatever a `matplotlibrc` in the working directory says (`rrtrain.core.figures`).

Each `build_*` returns `(figure, expected)`, where `expected` lists how many data series each panel
should hold; `save` counts the series actually drawn (artists tagged with gid "series") and refuses
to write a figure that does not match, so a silently empty or doubled plot is a bug, not an output.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from rrtrain.core.figures import Figure, Line2D, default_style
from rrtrain.core.io import atomic_path
from rrtrain.report.analysis import Analysis
from rrtrain.report.collect import is_convex
from rrtrain.report.transfer import TransferLine

SERIES = "series"
DPI = 110


class PlotError(RuntimeError):
    """A figure does not hold the series it should (a bug in the report, not in the input)."""


def colours(variants: list[str]) -> dict[str, str]:
    """A fixed colour per variant (tab10 order over the sorted names), the same in every figure."""
    palette = [f"C{i}" for i in range(10)]
    return {v: palette[i % 10] for i, v in enumerate(sorted(variants))}


def count_series(ax) -> int:
    return sum(1 for a in ax.get_children() if a.get_gid() == SERIES)


def save(fig: Figure, expected: list[int], path: Path) -> dict[str, object]:
    """Check the series per panel against `expected`, then write the PNG atomically."""
    got = [count_series(ax) for ax in fig.axes]
    if got != expected:
        raise PlotError(f"{path.name}: series per panel {got}, expected {expected}")
    if sum(got) == 0:
        raise PlotError(f"{path.name}: nothing to draw")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    return {"file": path.name, "panels": len(got), "series": got}


def _tag(artist):
    artist.set_gid(SERIES)
    return artist


def build_loss_vs_params(a: Analysis) -> tuple[Figure, list[int]]:
    """Final validation loss against parameters, one series per variant, error bars = SD over seeds."""
    fig = Figure(figsize=(7.0, 4.8), layout="constrained")
    ax = fig.add_subplot()
    col = colours(a.variants)
    n = 0
    for v in a.variants:
        pts = [(s.params, s.variants[v]) for s in a.sizes if s.params and v in s.variants and s.variants[v].n]
        if not pts:
            continue
        x = [p for p, _ in pts]
        y = [vs.mean for _, vs in pts]
        err = [vs.sd or 0.0 for _, vs in pts]
        cont = ax.errorbar(x, y, yerr=err, marker="o", capsize=3, color=col[v],
                           linestyle="--" if is_convex(v) else "-", label=v)
        _tag(cont.lines[0])
        n += 1
    ax.set_xscale("log")
    ax.set_xlabel(f"parameters (mean of {a.reference} runs at each size)")
    ax.set_ylabel("final validation loss")
    ax.set_title("Final validation loss by size (error bars: SD over seeds)")
    if n:
        ax.legend(fontsize="small")
    ax.grid(True, which="both", alpha=0.3)
    return fig, [n]


def build_advantage(a: Analysis) -> tuple[Figure, list[int]]:
    """Baseline − reference against parameters with the weighted fit, and its extrapolation."""
    fig = Figure(figsize=(10.0, 5.0), layout="constrained")
    ax = fig.add_subplot()
    col = colours(a.variants)
    n = 0
    xmax_all = []
    for b in a.baselines:
        tr = a.trends[b]
        if not tr.params:
            continue
        c = col[b]
        err = [se if se else 0.0 for se in tr.ses]
        cont = ax.errorbar(tr.params, tr.diffs, yerr=err, marker="o", capsize=3, linestyle="none",
                           color=c, label=f"{b} − {a.reference} (±1 SE)")
        _tag(cont.lines[0])
        n += 1
        if tr.fit is None:
            continue
        lo, hi = min(tr.params), max(tr.params)
        xs = np.logspace(math.log10(lo), math.log10(hi), 50)
        slope = f"{tr.slope:+.4f}/10×" + (f", p={tr.p:.2g}" if tr.p is not None else "")
        _tag(ax.plot(xs, tr.fit.intercept + tr.fit.slope * np.log10(xs), color=c,
                     label=f"{b}: {'weighted ' if tr.weighted else ''}fit ({slope})")[0])
        n += 1
        if tr.extrapolation:
            top = max(e.params for e in tr.extrapolation)
            if top > hi:
                xe = np.logspace(math.log10(hi), math.log10(top), 50)
                _tag(ax.plot(xe, tr.fit.intercept + tr.fit.slope * np.log10(xe), color=c, linestyle=":",
                             label=f"{b}: extrapolation")[0])
                n += 1
            if tr.fit.df >= 1:
                xb = np.logspace(math.log10(lo), math.log10(max(top, hi)), 80)
                preds = [tr.fit.predict(math.log10(x)) for x in xb]
                _tag(ax.fill_between(xb, [p["pi_lo"] for p in preds], [p["pi_hi"] for p in preds], color=c,
                                     alpha=0.15, label=f"{b}: 95% prediction interval"))
                n += 1
            ax.plot([e.params for e in tr.extrapolation], [e.fit for e in tr.extrapolation], marker="x",
                    linestyle="none", color=c)  # untagged: marks the requested sizes on the dotted line
            xmax_all.append(top)
    ax.axhline(0.0, color="0.5", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(f"parameters (mean of {a.reference} runs at each size)")
    ax.set_ylabel(f"baseline − {a.reference} final val loss (nats)\npositive: {a.reference} better")
    ax.set_title(f"Advantage of {a.reference} across sizes" + (" (dotted: extrapolation)" if xmax_all else ""))
    if n:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.grid(True, which="both", alpha=0.3)
    return fig, [n]


def build_curves(a: Analysis) -> tuple[Figure, list[int]]:
    """Training (top row) and validation (bottom row) loss per size; one colour per variant.

    Every run with logged losses is drawn, flagged and unfinished ones included, so a flagged run's
    curve shows why. Convex-gate variants (the registry's `convex` rules) are dashed. A long curve arrives cut
    to its envelope (`rrtrain.report.curves.downsample`), which draws the same pixels at this width.
    """
    sizes = [s.size for s in a.sizes]
    runs_by_size = {s: [r.run for r in a.rows if r.run.size == s and r.run.variant] for s in sizes}
    sizes = [s for s in sizes if any(len(r.metrics.train_loss) or len(r.metrics.val_loss) for r in runs_by_size[s])]
    ncol = max(1, len(sizes))
    fig = Figure(figsize=(3.6 * ncol + 1.5, 6.4), layout="constrained")
    col = colours(a.variants)
    expected: list[int] = []
    axes = fig.subplots(2, ncol, squeeze=False)
    for j, size in enumerate(sizes):
        for i, (what, ylabel) in enumerate((("train", "training loss"), ("val", "validation loss"))):
            ax = axes[i][j]
            k = 0
            for run in runs_by_size[size]:
                m = run.metrics
                xs, ys = (m.train_steps, m.train_loss) if what == "train" else (m.val_steps, m.val_loss)
                if not len(xs):
                    continue
                style = "--" if is_convex(run.variant or "") else "-"
                _tag(ax.plot(xs, ys, color=col[run.variant], linestyle=style, linewidth=0.9 if what == "train" else 1.4,
                             marker=None if what == "train" else ".", alpha=0.85, label=f"_run:{run.rel}")[0])
                k += 1
            if not k:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="0.5")
            expected.append(k)
            ax.set_title(f"{size} — {what}", fontsize="medium")
            ax.set_xlabel("step")
            if j == 0:
                ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
    # figure order of axes is row-major: reorder expected (built column by column) to match
    expected = [expected[2 * j + i] for i in range(2) for j in range(len(sizes))] if sizes else [0, 0]
    shown = [v for v in a.variants if any(r.variant == v for s in sizes for r in runs_by_size[s])]
    handles = [Line2D([], [], color=col[v], linestyle="--" if is_convex(v) else "-", label=v) for v in shown]
    if handles:
        fig.legend(handles=handles, loc="outside right upper", fontsize="small")
    return fig, expected


PLOTS = {
    "loss_vs_params.png": build_loss_vs_params,
    "advantage.png": build_advantage,
    "curves.png": build_curves,
}


def write_all(a: Analysis, out: Path) -> dict[str, dict[str, object]]:
    """Build, check and save every plot that has data; returns {file: {panels, series} or {skipped: why}}."""
    done: dict[str, dict[str, object]] = {}
    with default_style():
        for name, build in PLOTS.items():
            fig, expected = build(a)
            if sum(expected) == 0:
                done[name] = {"file": name, "skipped": "nothing to draw"}
                continue
            done[name] = save(fig, expected, out / name)
    return done


TRANSFER_PLOT = "transfer_lr.png"
AXIS_LABELS = {"width": "d_model", "depth": "blocks", "shape": "parameters"}
PARAM_STYLES = {"sp": "-", "mup": "--", "completep": "--"}


def build_transfer_lr(lines: list[TransferLine]) -> tuple[Figure, list[int]]:
    """The best learning rate against the width or the depth (the parameters where both change), one panel per
    axis, a line per (variant, parametrization, other keys), sp solid: flat where the base's transfers."""
    kinds = [k for k in AXIS_LABELS if any(t.axis == k for t in lines)]
    fig = Figure(figsize=(5.5 * max(1, len(kinds)) + 2.0, 4.5), layout="constrained")
    col = colours(sorted({t.variant for t in lines}))
    expected = []
    for i, kind in enumerate(kinds):
        ax = fig.add_subplot(1, len(kinds), i + 1)
        n = 0
        attr = {"width": "width", "depth": "depth", "shape": "params"}[kind]
        for t in (t for t in lines if t.axis == kind):
            pts = [(getattr(s, attr), s.best) for s in t.shapes if s.best is not None and getattr(s, attr)]
            if not pts:
                continue
            _tag(ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", color=col[t.variant],
                         linestyle=PARAM_STYLES.get(t.parametrization, ":"), label=t.label)[0])
            n += 1
        expected.append(n)
        ax.set_xscale("log", base=2 if kind != "shape" else 10)
        ax.set_yscale("log")
        ax.set_xlabel(AXIS_LABELS[kind])
        ax.set_ylabel("best learning rate")
        ax.set_title(f"Best learning rate against {AXIS_LABELS[kind]}", fontsize="medium")
        if n:
            ax.legend(fontsize="small")
        ax.grid(True, which="both", alpha=0.3)
    return fig, expected


def write_transfer(lines: list[TransferLine], out: Path) -> dict[str, object]:
    """The transfer plot, when a line has a best learning rate; {skipped: why} otherwise."""
    with default_style():
        fig, expected = build_transfer_lr(lines)
        if sum(expected) == 0:
            return {"file": TRANSFER_PLOT, "skipped": "nothing to draw"}
        return save(fig, expected, out / TRANSFER_PLOT)
