"""The grid section of report.md, its console summary and its part of summary.json: formatting only; the numbers
come from `rrtrain.report.grid`."""

from __future__ import annotations

import dataclasses
from typing import Any

from rrtrain.report import transfer
from rrtrain.report.grid import GridAnalysis, LrFit, describe_point
from rrtrain.report.render import DASH, _clean, _table, count, fixed, table2
from rrtrain.rundir.points import point_label


def _lr(x: float | None) -> str:
    return DASH if x is None else f"{x:.3g}"


def _side_by_side(ga: GridAnalysis) -> list[str]:
    """One row per size and variant: the chosen point and its mean on the test seeds, the shared point's mean."""
    def cell(a, size: str, v: str) -> str:
        if a is None:
            return DASH
        row = next((s for s in a.sizes if s.size == size), None)
        vs = row.variants.get(v) if row is not None else None
        if vs is None or not vs.n:
            return DASH
        return f"{fixed(vs.mean, 4)}" + (f" ± {fixed(vs.sd, 4)}" if vs.sd is not None else "") + f" ({vs.n})"

    rows = []
    for g in ga.groups:
        edge = f" (at the edge: {', '.join(g.edge)})" if g.edge else ""
        rows.append([g.size, g.variant, describe_point(g.chosen) + edge, cell(ga.selected, g.size, g.variant),
                     cell(ga.at_shared, g.size, g.variant)])
    return _table(["Size", "variant", "selected point", "at the selected point (test seeds)",
                   f"at the shared point {point_label(ga.shared)}"], rows)


def _points_table(ga: GridAnalysis) -> list[str]:
    rows = []
    for g in ga.groups:
        for p in g.points:
            chosen = "**chosen**" if g.chosen is not None and p.point == g.chosen else ""
            rows.append([g.size, g.variant, point_label(p.point), fixed(p.score, 4) if p.score is not None else DASH,
                         chosen or (p.why_out if p.score is None else ""),
                         ", ".join(f"{s}: {st}" for s, st in p.statuses.items())])
    return _table(["Size", "variant", "point", "selection loss", "verdict", "runs (seed: outcome)"], rows)


def _fit_name(f: LrFit) -> str:
    return f.variant if f.parametrization == "sp" and not f.other else f.label


def _base_cell(f: LrFit) -> str:
    """Under mup/completep: the base shape's lr, which the parametrization says every size shares, and what the
    sweep measured of it."""
    if f.base_lr is None:
        return ""
    measured = "" if f.transfers is None else "; measured: " + ("transfers" if f.transfers else "does not transfer")
    return f"{_lr(f.base_lr)} transfers ({f.parametrization}{measured})"


def _lr_section(fits: list[LrFit]) -> list[str]:
    if not fits:
        return []
    L = ["", "### The best learning rate across sizes", ""]
    rows = []
    for f in fits:
        pts = ", ".join(f"{s} ({count(n)}): {_lr(lr)}" for s, n, lr in zip(f.sizes, f.params, f.lrs))
        law = f"{f.a:.3g} · N^{f.b:+.3f}" if f.a is not None and f.b is not None else DASH
        ci = f"[{f.b_lo:+.3f}, {f.b_hi:+.3f}]" if f.b_lo is not None and f.b_hi is not None else DASH
        rows.append([_fit_name(f), pts, law, ci, _base_cell(f) or DASH, f.reason or ""])
    L += _table(["variant", "best lr per size", "fit: lr = a · N^b", "95% interval of b",
                 "base lr (mup, completep)", "note"], rows)
    preds = []
    for f in fits:
        by_size = {p.size: p for p in f.predictions}
        names = list(by_size) + [name for name, _ in f.base_for if name not in by_size]
        for name in names:
            p = by_size.get(name)
            n = p.params if p is not None else dict(f.base_for)[name]
            interval = DASH
            if p is not None:
                interval = f"[{_lr(p.pi_lo)}, {_lr(p.pi_hi)}]" if p.pi_lo is not None else DASH + " (needs 3 sizes)"
            preds.append([_fit_name(f), name, count(n), _lr(p.lr) if p is not None else DASH, interval,
                          _base_cell(f) or DASH])
    if preds:
        L += ["", "Suggested learning rate at the larger sizes (the fit's value; 95% prediction interval; under mup "
              "and completep the base shape's learning rate, which the parametrization carries to every size):", ""]
        L += _table(["variant", "size", "parameters", "suggested lr", "interval", "under mup/completep"], preds)
    L += ["", "Least squares of log10(lr) on log10(parameters) over the sizes where the variant's chosen point has "
          "a learning rate; the interval of b is Student's t with sizes − 2 degrees of freedom."]
    return L


def _transfer_section(ga: GridAnalysis, plot: str | None) -> list[str]:
    """The best lr against the width or depth per parametrization, and whether the base's transfers."""
    if not ga.transfer:
        return []
    L = ["", "### The best learning rate against the width or depth", ""]
    rows = []
    for t in ga.transfer:
        for s in t.shapes:
            base = t.base is not None and s is t.base
            mark = "*" if s.on_selection else ""
            rows.append([t.label, s.size, s.width if s.width is not None else "?",
                         s.depth if s.depth is not None else "?", count(s.params),
                         (_lr(s.best) + (" (edge)" if s.edge else "")) if s.best is not None else "failed",
                         "base" if base else (DASH if s.steps is None else str(s.steps)),
                         fixed(s.own_loss, 4) + (mark if s.own_loss is not None else ""),
                         DASH if base else fixed(s.base_loss, 4) + (mark if s.base_loss is not None else ""),
                         DASH if base or s.cost is None else f"{100 * s.cost:+.2f}%"])
    L += _table(["line", "size", "d_model", "blocks", "parameters", "best lr", "grid steps from the base's",
                 "loss at its best (test seeds)", "at the base's lr", "cost of the base's lr"], rows)
    if any(s.on_selection for t in ga.transfer for s in t.shapes):
        L += ["", "\\* the mean of the selection seeds: no test seed ran (or one failed), so the "
              "chosen learning rate's loss is biased low and the base's cost upward."]
    L += [""] + [f"- {t.label}: {t.verdict}" + (f" ({'; '.join(t.notes)})" if t.notes else "") for t in ga.transfer]
    L += ["", "Per line (variant, parametrization, other grid keys) and shape, the learning rate with the lowest "
          "selection loss; the base is the line's smallest shape. The base's learning rate transfers where every "
          "shape's best is within 1 grid step of it and it costs at most 0.5% of loss (docs/transfer.md)."]
    if plot:
        L += ["", f"![best learning rate against the width or depth]({plot})"]
    return L


def grid_md(ga: GridAnalysis, sweep_name: str, transfer_plot: str | None = None) -> str:
    L = [f"# rrtrain report: {sweep_name}", "", "## A grid over " + ", ".join(f"`{k}`" for k in ga.keys), "",
         f"Selection rule: {ga.rule}. Shared point: {point_label(ga.shared)} ({ga.shared_source}).", ""]
    L += _side_by_side(ga)
    failed = [g for g in ga.groups if g.failed_everywhere]
    if failed:
        L += ["", "### Failed at every point", ""]
        for g in failed:
            tried = "; ".join(f"{point_label(p.point)}: {p.why_out}" for p in g.points)
            L.append(f"- {g.size} {g.variant}: no point trained cleanly — {tried}")
    L += ["", "### Every point", ""] + _points_table(ga)
    if ga.selected is not None:
        L += ["", "### The paper's table at the selected settings (test seeds)", ""] + table2(ga.selected)
    if ga.at_shared is not None:
        L += ["", f"### The paper's table at the shared point {point_label(ga.shared)} (test seeds)", ""]
        L += table2(ga.at_shared)
    L += _transfer_section(ga, transfer_plot)
    L += _lr_section(ga.lr_fits)
    if ga.notes:
        L += ["", "### Notes", ""] + [f"- {n}" for n in ga.notes]
    return "\n".join(L) + "\n"


def grid_text(ga: GridAnalysis) -> str:
    """The console summary: the rule, each (size, variant)'s choice, failures and the suggested learning rates."""
    L = [f"selection: {ga.rule}", f"shared point: {point_label(ga.shared)} ({ga.shared_source})"]
    for g in ga.groups:
        if g.chosen is None:
            L.append(f"  {g.size} {g.variant}: FAILED at every point ("
                     + "; ".join(f"{point_label(p.point)}: {p.why_out}" for p in g.points) + ")")
        else:
            edge = f" (at the edge of the grid: {', '.join(g.edge)})" if g.edge else ""
            L.append(f"  {g.size} {g.variant}: {point_label(g.chosen)}{edge}")
    for t in ga.transfer:
        L.append(f"  transfer {t.label}: {t.verdict}")
    for f in ga.lr_fits:
        base = _base_cell(f)
        if f.b is not None:
            ci = f" (95% interval of b [{f.b_lo:+.3f}, {f.b_hi:+.3f}])" if f.b_lo is not None else ""
            L.append(f"  lr fit {_fit_name(f)}: lr = {f.a:.3g} * N^{f.b:+.3f}{ci}"
                     + (f"; base lr {base}" if base else ""))
        elif base:
            L.append(f"  lr {_fit_name(f)}: base lr {base}")
        by_size = {p.size: p for p in f.predictions}
        for name in list(by_size) + [name for name, _ in f.base_for if name not in by_size]:
            p = by_size.get(name)
            n = p.params if p is not None else dict(f.base_for)[name]
            fitted = f"{_lr(p.lr)} (fit)" if p is not None else "no fit"
            L.append(f"    suggested lr for {name} ({count(n)}): {fitted}"
                     + (f"; {f.parametrization}: the base lr {_lr(f.base_lr)} transfers" if f.base_lr is not None
                        else ""))
    return "\n".join(L)


def grid_summary(ga: GridAnalysis) -> dict[str, Any]:
    return _clean({
        "rule": ga.rule, "select_seeds": ga.select_seeds, "keys": ga.keys, "shared": ga.shared,
        "shared_source": ga.shared_source,
        "groups": [{"size": g.size, "variant": g.variant, "chosen": g.chosen, "failed_everywhere": g.failed_everywhere,
                    "params": g.params, "edge": g.edge, "points": [dataclasses.asdict(p) for p in g.points]}
                   for g in ga.groups],
        "lr_fits": [dataclasses.asdict(f) for f in ga.lr_fits],
        "transfer": transfer.summary(ga.transfer),
        "notes": ga.notes,
    })
