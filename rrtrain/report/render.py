"""Text outputs: report.md (the paper's Table 2 and the rest), results.csv (one row per run) and
summary.json (every number in the report, machine-readable). Formatting only; numbers come from
`rrtrain.report.analysis`."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from rrtrain.report.analysis import Analysis, Comparison, RunRow, SizeRow
from rrtrain.report.spikes import THRESHOLD_SD, WINDOW

DASH = "—"


# ---------------------------------------------------------------------------------------------- numbers


def fixed(x: float | None, places: int, signed: bool = False) -> str:
    """`x` to `places` decimals, rounding the decimal value half-up.

    The value is first read at 12 significant digits, so binary noise cannot flip a tie: the paper's
    1B row, 1.5031 − 1.4876 = 0.0155 exactly, is 0.015499999999999847 in floating point and would
    print as +0.015 with `format`; here it prints +0.016, as in the paper.
    """
    if x is None or not math.isfinite(x):
        return DASH
    if abs(x) >= 1e12:  # a diverged run's loss; beyond what decimal places are for
        return f"{x:+.3e}" if signed else f"{x:.3e}"
    q = Decimal(f"{x:.12g}").quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    text = f"{abs(q):.{places}f}"
    if x < 0:
        return "-" + text
    return ("+" + text) if signed and x > 0 else text


def pval(p: float | None) -> str:
    if p is None or not math.isfinite(p):
        return DASH
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def count(n: float | None) -> str:
    """A parameter count as ~60M / ~1.2B."""
    if not n:
        return "?"
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"~{n / scale:.3g}{unit}"
    return f"~{n:.3g}"


def pct(x: float | None) -> str:
    return DASH if x is None else f"{100 * x:.2f}%"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out


# ---------------------------------------------------------------------------------------------- table 2


def variant_cell(s: SizeRow, v: str) -> str:
    vs = s.variants.get(v)
    if vs is None or not vs.n:
        return DASH
    if vs.sd is None:
        return f"{fixed(vs.mean, 4)} ({vs.n})"
    return f"{fixed(vs.mean, 4)} ± {fixed(vs.sd, 4)} ({vs.n})"


def _short(c: Comparison, ref: str) -> str:
    if c.verdict == "n/a":
        return "n/a"
    t = fixed(c.t, 1)
    if c.verdict == "yes":
        return f"yes (t={t})" if c.better == ref else f"yes, {c.baseline} better (t={t})"
    return f"no (t={t})"


def significance_cell(s: SizeRow, ref: str, baselines: list[str]) -> str:
    """The paper's "significant?" column: one verdict when all comparisons agree, else one per baseline."""
    comps = [s.comparisons[b] for b in baselines]
    if not comps:
        return DASH
    if all(c.verdict == "n/a" for c in comps):
        if all(c.n_ref and c.n_base for c in comps):
            counts = ", ".join([f"{ref} {comps[0].n_ref}"] + [f"{c.baseline} {c.n_base}" for c in comps])
            if any(c.n_ref < 2 or c.n_base < 2 for c in comps):
                return f"n/a: seeds {counts}; Welch's test needs ≥ 2 per side"
        return "n/a: " + "; ".join(sorted({c.reason for c in comps}))
    same_yes = all(c.verdict == "yes" and c.better == ref for c in comps)
    same_no = all(c.verdict == "no" for c in comps)
    if same_yes or same_no:
        return f"{'yes' if same_yes else 'no'} (t={', '.join(fixed(c.t, 1) for c in comps)})"
    return "; ".join(f"{c.baseline}: {_short(c, ref)}" for c in comps)


def table2(a: Analysis) -> list[str]:
    ref, bases = a.reference, a.baselines
    header = ["Size"] + [ref] + bases + [f"{b} − {ref}" for b in bases] + [f"significant? (α = {a.options.alpha:g})"]
    rows = []
    for s in a.sizes:
        row = [f"{s.size} ({count(s.params)})"] + [variant_cell(s, v) for v in [ref, *bases]]
        row += [fixed(s.comparisons[b].diff, 3, signed=True) for b in bases]
        row.append(significance_cell(s, ref, bases))
        rows.append(row)
    return _table(header, rows)


# ---------------------------------------------------------------------------------------------- report.md


def report_md(a: Analysis, plots: dict[str, dict[str, Any]], sweep_name: str) -> str:
    o = a.options
    ref, bases = a.reference, a.baselines
    flagged = [r for r in a.rows if r.run.category == "flagged"]
    unfinished = [r for r in a.rows if r.run.category == "unfinished"]
    unusable = [r for r in a.rows if r.run.category == "unusable"]
    L: list[str] = [f"# rrtrain report: {sweep_name}", ""]
    L.append(
        f"Reference **{ref}**; baselines: {', '.join(bases) or 'none'}. "
        f"{len(a.rows)} runs found: {len(a.included)} in the means, {len(flagged)} flagged, "
        f"{len(unfinished)} unfinished, {len(unusable)} unusable."
    )
    L += ["", "## Final validation loss by size (the paper's Table 2)", ""]
    L += table2(a)
    L += [
        "",
        f"Cells: mean ± standard deviation over seeds (n seeds). `{bases[0] if bases else 'baseline'} − {ref}` is the "
        f"difference of the means: **positive means {ref} has the lower (better) loss**, the way the paper's "
        f"\"Rev − Hwy\" and \"Rev − Std\" columns read. Significance: Welch's two-sample t-test on the per-seed "
        f"losses, two-sided, at α = {o.alpha:g}; t > 0 favours {ref}.[^welch] "
        f"Flagged runs: {len(flagged)}, {'included' if o.include_flagged else 'excluded'}.[^flagged]",
        "",
    ]
    L += ["## Welch t-tests", ""]
    rows = []
    for s in a.sizes:
        for b in bases:
            c = s.comparisons[b]
            verdict = c.verdict if c.verdict != "yes" else f"yes, {c.better} better"
            rows.append([s.size, f"{b} − {ref}", f"{c.n_ref}, {c.n_base}", fixed(c.diff, 4, True), fixed(c.se, 4),
                         fixed(c.t, 2), fixed(c.df, 1), pval(c.p), pval(c.p_holm),
                         verdict + (f" ({c.reason})" if c.reason else "")])
    L += _table(["Size", "comparison", f"n ({ref}, baseline)", "difference", "SE", "t", "df (Welch)", "p",
                 "p (Holm)[^holm]", f"p < {o.alpha:g}?"], rows)
    L += ["", "## Losses and stability per variant", ""]
    rows = []
    for s in a.sizes:
        for v, vs in s.variants.items():
            rows.append([s.size, v, vs.n, fixed(vs.mean, 4), fixed(vs.sd, 4), fixed(vs.best_mean, 4),
                         f"{pct(vs.spike_score)} ({vs.spike_runs} run{'s' if vs.spike_runs != 1 else ''})",
                         pct(vs.spike_max), vs.flagged, vs.unfinished, ", ".join(str(x) for x in vs.seeds) or DASH])
    L += _table(["Size", "variant", "n", "mean", "SD", "best val (mean)", "spike score[^spike]", "max", "flagged",
                 "unfinished", "seeds in mean"], rows)
    L += downstream_section(a)
    L += sources_section(a)
    L += branches_section(a)
    L += _trend_section(a)
    L += _ahead_section(a)
    L += _run_lists(flagged, unfinished, unusable, o.include_flagged)
    if a.notes:
        L += ["", "## Notes", ""] + [f"- {n}" for n in a.notes]
    L += ["", "## Plots", ""]
    for name, info in plots.items():
        if "skipped" in info:
            L.append(f"- {name}: not drawn ({info['skipped']})")
        else:
            L.append(f"![{name}]({name})")
    L += ["", *_footnotes(a, flagged)]
    return "\n".join(L) + "\n"


def _source_names(a: Analysis) -> list[str]:
    """The sources of the runs trained on mixtures (`data.sources`), in the order the runs name them."""
    return list(dict.fromkeys(k for r in a.rows for k in r.run.metrics.val_sources))


def sources_section(a: Analysis) -> list[str]:
    """Runs trained on a mixture of datasets: each source's validation loss (`val/<name>`) at the run's last
    evaluation that has them; nothing when no run has any."""
    names = _source_names(a)
    if not names:
        return []
    rows = []
    for r in a.rows:
        m = r.run.metrics
        if m.val_sources:
            rows.append([r.run.rel, r.run.size or "?", r.run.variant or "?",
                         r.run.seed if r.run.seed is not None else "?", m.val_sources_step,
                         fixed(r.run.final_val_loss, 4), *(fixed(m.val_sources.get(n), 4) for n in names)])
    L = ["", "## Validation loss per source", "",
         "Runs trained on a weighted mixture of datasets (`data.sources`): the loss on each source's own validation "
         "split at the run's last evaluation; the final validation loss is their mean weighted as the sources are "
         "in training.", ""]
    return L + _table(["run", "size", "variant", "seed", "step", "final val loss", *(f"val/{n}" for n in names)],
                      rows)


def branches_section(a: Analysis) -> list[str]:
    """Cooldown branches (`train.branch_from`) by token budget: for each parent, the parent itself (where the
    report found it) and its branches, in the order of the tokens each trained to: the loss against tokens of one
    run and its cooldowns. Nothing when no run is a branch."""
    branches = [r.run for r in a.rows if r.run.branch_from is not None]
    if not branches:
        return []
    found = {os.path.realpath(r.run.path): r.run for r in a.rows}
    groups: dict[str, list[tuple[Any, Any]]] = {}
    for run in branches:
        groups.setdefault(run.branch_from[0], []).append((run, run.branch_from[1]))
    rows = []
    for parent, members in sorted(groups.items()):
        trunk = found.get(os.path.realpath(parent))
        members = ([(trunk, DASH)] if trunk is not None else []) + members
        for run, step in sorted(members, key=lambda m: (m[0].tokens is None, m[0].tokens or 0, m[0].rel)):
            rows.append([trunk.rel if trunk is not None else parent, run.rel, step,
                         run.tokens if run.tokens is not None else DASH, fixed(run.final_val_loss, 4), run.status])
    L = ["", "## Cooldown branches by token budget", "",
         "Runs started from another run's checkpoint (`train.branch_from=RUN_DIR@STEP`), each with its own budget "
         "and decay, listed under their parent (the parent's own row has no branch step), by the tokens trained.", ""]
    return L + _table(["parent", "run", "branch step", "tokens", "final val loss", "status"], rows)


def downstream_section(a: Analysis) -> list[str]:
    """The downstream tables (`rrtrain.report.downstream`): one per task and primary metric, as the loss table,
    then their Welch tests; nothing when no run in the means has downstream values."""
    d = a.downstream
    if d is None or not d.tables:
        return []
    o, ref = a.options, a.reference
    L = ["", "## Downstream tasks", "",
         f"The runs of the loss table, each with its final downstream values (those of the largest step it has any: "
         f"in-loop `downstream/TASK/METRIC` records of metrics.jsonl and `rrtrain eval`'s `eval/` result files, a "
         f"file's value winning at the same step). Per task its primary metric(s): "
         + "; ".join(f"{t} ({why})" for t, why in d.why.items()) + ". Cells and the significance column read as in "
         f"the loss table (Welch's t-test at α = {o.alpha:g}, t = (baseline − {ref}) / SE), but the direction is "
         f"each metric's own: **for a higher-is-better metric (acc) a negative difference means {ref} is better**, "
         f"for a lower-is-better one (bits_per_byte, perplexity) a positive one does. As in the loss table, `yes` "
         f"alone means {ref} is significantly better (by the metric's direction), `yes, X better` that X is."]
    for t in d.tables:
        sense = "higher is better" if t.higher_better else "lower is better"
        L += ["", f"### {t.task}: {t.metric} ({sense})", ""]
        L += table2(t.analysis)
        notes = []
        if len(t.steps) > 1:
            notes.append("the runs' last evaluated steps differ: "
                         + ", ".join(f"step {s} ({n} run{'s' if n != 1 else ''})" for s, n in t.steps.items()))
        elif t.steps:
            notes.append(f"values at step {next(iter(t.steps))}")
        if t.missing:
            notes.append(f"{t.missing} run(s) in the loss means have no {t.metric} for {t.task}")
        if notes:
            text = "; ".join(notes)
            L += ["", text[0].upper() + text[1:] + "."]  # not str.capitalize: a task's name keeps its case
    if d.untested:
        L += ["", "Recorded but not tabled (not a primary metric): " + ", ".join(d.untested) + "."]
    L += ["", "### Downstream Welch t-tests", ""]
    rows = []
    for t in d.tables:
        for s in t.analysis.sizes:
            for b in t.analysis.baselines:
                c = s.comparisons[b]
                verdict = c.verdict if c.verdict != "yes" else f"yes, {c.better} better"
                rows.append([f"{t.task}/{t.metric}", s.size, f"{b} − {ref}", f"{c.n_ref}, {c.n_base}",
                             fixed(c.diff, 4, True), fixed(c.se, 4), fixed(c.t, 2), fixed(c.df, 1), pval(c.p),
                             pval(c.p_holm), verdict + (f" ({c.reason})" if c.reason else "")])
    L += _table(["task/metric", "Size", "comparison", f"n ({ref}, baseline)", "difference", "SE", "t", "df (Welch)",
                 "p", "p (Holm, all downstream tests)", f"p < {o.alpha:g}?"], rows)
    return L


def downstream_summary(a: Analysis) -> dict[str, Any]:
    """summary.json's `downstream`: per "TASK/METRIC", its direction, steps and per-size stats and tests."""
    d = a.downstream
    out: dict[str, Any] = {"tables": {}, "untested": list(d.untested) if d else [], "why": dict(d.why) if d else {}}
    for t in d.tables if d else []:
        out["tables"][f"{t.task}/{t.metric}"] = {
            "task": t.task, "metric": t.metric, "higher_is_better": t.higher_better,
            "steps": {str(k): n for k, n in t.steps.items()}, "missing": t.missing,
            "sizes": [{"size": s.size, "params": s.params,
                       "variants": {v: {"n": vs.n, "seeds": vs.seeds, "values": vs.losses, "mean": vs.mean, "sd": vs.sd}
                                    for v, vs in s.variants.items()},
                       "comparisons": {b: {k: v for k, v in dataclasses.asdict(c).items() if k != "power"}
                                       for b, c in s.comparisons.items()}}
                      for s in t.analysis.sizes]}
    return out


def _trend_section(a: Analysis) -> list[str]:
    ref = a.reference
    L = ["", "## Across sizes: does the advantage grow with scale?", ""]
    rows = []
    for b, tr in a.trends.items():
        rows.append([f"{b} − {ref}", len(tr.sizes), fixed(tr.slope, 4, True), fixed(tr.se, 4), fixed(tr.t, 2),
                     tr.df if tr.df is not None else DASH, pval(tr.p),
                     ("1/SE² per size" if tr.weighted else "equal") + (f" — {tr.reason}" if tr.reason else ""),
                     fixed(tr.slope_equal, 4, True)])
    L += _table(["comparison", "sizes", "slope (nats per 10× params)", "SE", "t", "df", "p", "weights",
                 "equal-weight slope"], rows)
    L += ["", f"Weighted least squares of the difference against log10(parameters); a positive slope means "
          f"{ref}'s advantage grows with size. The SE comes from the scatter of the sizes about the line "
          f"(df = sizes − 2), so it reflects misfit as well as seed noise.[^trend]"]
    return L


def _ahead_section(a: Analysis) -> list[str]:
    o = a.options
    ref = a.reference
    L = ["", "## Looking ahead", ""]
    if o.extrapolate:
        L += ["### Extrapolated advantage (an extrapolation, not a measurement)", ""]
        rows = []
        for b, tr in a.trends.items():
            if not tr.extrapolation:
                rows.append([f"{b} − {ref}", DASH, DASH, DASH, DASH, DASH, f"no fit: {tr.reason}"])
            for e in tr.extrapolation:
                ci = f"[{fixed(e.ci_lo, 3, True)}, {fixed(e.ci_hi, 3, True)}]"
                pi = f"[{fixed(e.pi_lo, 3, True)}, {fixed(e.pi_hi, 3, True)}]"
                need = str(e.seeds_needed) if e.seeds_needed else f"n/a ({e.reason})"
                if e.seeds_needed and (e.pi_lo is None or e.pi_lo <= 0):
                    need += " if the fit holds (the interval includes no advantage)"
                rows.append([f"{b} − {ref}", count(e.params), f"{e.beyond:.3g}×", fixed(e.fit, 3, True), ci, pi, need])
        L += _table(["comparison", "parameters", "beyond largest trained", "fitted difference", "95% CI (line)",
                     "95% prediction interval", f"seeds/variant for {o.power:.0%} power"], rows)
        L += ["", "The line fitted above, continued past the largest size trained. It assumes the advantage "
              "stays linear in log(parameters), which nothing in the sweep can check beyond its range. The "
              "prediction interval is for the difference a new size would show if measured as precisely as "
              "a typical size of this sweep; when it includes 0, the sweep does not predict an advantage "
              "there. The seed count assumes the fitted difference and the seed-to-seed SD of the largest "
              "size measured.", ""]
    effect_text = (f"a given difference of {o.effect:g} nats (--effect)" if o.effect is not None
                   else "the observed difference")
    L += [f"### Power: seeds per variant to detect {effect_text} with {o.power:.0%} power at α = {o.alpha:g}", ""]
    rows = []
    for s in a.sizes:
        for b in a.baselines:
            c = s.comparisons[b]
            p = c.power
            if p is None:
                continue
            need = str(p.seeds_needed) if p.seeds_needed else f"n/a ({p.reason})"
            rows.append([s.size, f"{b} − {ref}", fixed(p.effect, 4), fixed(p.sd, 4), fixed(p.d, 2), need,
                         f"{c.n_ref}, {c.n_base}"])
    L += _table(["Size", "comparison", "effect (nats)", "seed SD (pooled)", "d = effect/SD", "seeds per variant",
                 f"have ({ref}, baseline)"], rows)
    L += ["", "Two-sided two-sample t-test, equal seeds per variant, power from the noncentral t distribution. "
          "Planning for the observed difference is optimistic: an observed difference that cleared a "
          "threshold tends to overstate the true one (use --effect for the smallest difference worth finding)."]
    return L


def _run_table(rows: list[RunRow]) -> list[str]:
    body = []
    for r in rows:
        run = r.run
        body.append([run.rel, run.size or "?", run.variant or "?", run.seed if run.seed is not None else "?",
                     run.status, ", ".join(run.flags) or DASH, fixed(run.final_val_loss, 4),
                     run.step if run.step is not None else _last_step(r), r.note or run.reason])
    return _table(["run", "size", "variant", "seed", "status", "flags", "final val loss", "step", "why"], body)


def _last_step(r: RunRow) -> Any:
    step = r.run.metrics.last_train_step
    return step if step is not None else DASH


def _run_lists(flagged: list[RunRow], unfinished: list[RunRow], unusable: list[RunRow], include: bool) -> list[str]:
    L: list[str] = []
    if flagged:
        L += ["", f"## Flagged runs ({'included in' if include else 'excluded from'} the means)", ""]
        L += _run_table(flagged)
    if unfinished:
        L += ["", "## Unfinished runs (listed, never averaged)", ""] + _run_table(unfinished)
    if unusable:
        L += ["", "## Unusable runs", ""] + _run_table(unusable)
    return L


def _footnotes(a: Analysis, flagged: list[RunRow]) -> list[str]:
    o = a.options
    ntests = sum(c.p is not None for s in a.sizes for c in s.comparisons.values())
    nholm = sum(c.p_holm is not None and c.p_holm < o.alpha for s in a.sizes for c in s.comparisons.values())
    where: dict[str, int] = {}
    for r in flagged:
        key = f"{r.run.size} {r.run.variant}"
        where[key] = where.get(key, 0) + 1
    fl = "; ".join(f"{k}: {n}" for k, n in sorted(where.items())) or "none"
    return [
        f"[^welch]: `scipy.stats.ttest_ind(baseline, reference, equal_var=False)`; degrees of freedom by "
        f"Welch–Satterthwaite. \"n/a\" when a side has fewer than 2 seeds (no variance to test against) or "
        f"neither side varies. The verdict uses each test's own p; the Holm column corrects for running them all.",
        f"[^flagged]: {len(flagged)} run(s) flagged (status stalled, diverged or failed, or a monitor flag): {fl}. "
        + ("Included in the means (--include-flagged) when they have a final validation loss."
           if o.include_flagged else "Excluded from the means and tests; --include-flagged keeps them."),
        f"[^holm]: Holm–Bonferroni over all {ntests} tests in this table; {nholm} stay below α = {o.alpha:g} "
        f"after the correction.",
        f"[^spike]: Fraction of logged training steps whose loss exceeds the mean of the previous {WINDOW} "
        f"logged losses by more than {THRESHOLD_SD:g} standard deviations (OLMo-core StabilityMonitor); "
        f"a NaN/inf loss counts as a spike. Mean over every finished run of the variant at that size, "
        f"flagged runs included; \"max\" is the worst run. {DASH} when no run logged more than {WINDOW} losses.",
        "[^trend]: Weights are 1/SE² of each size's difference when every size has 2+ seeds on each side, "
        "otherwise equal. With 2–3 seeds a size's SE is itself noisy, so treat the weighting as approximate.",
    ]


# ---------------------------------------------------------------------------------------------- csv, json

CSV_FIELDS = [
    "run", "size", "variant", "seed", "status", "category", "included", "note", "flags", "params", "step",
    "tokens", "final_val_loss", "best_val_loss", "wall_s", "train_points", "last_train_loss", "val_points",
    "spike_score", "spikes", "nonfinite_losses", "relogged_steps", "bad_lines", "problems",
]


def results_csv(a: Analysis) -> str:
    """One row per run; with downstream results, a `downstream_step` column and one `downstream/TASK/METRIC` column
    per key any run has (its final values), after the others."""
    keys = sorted({k for r in a.rows for k in r.run.downstream})
    extra = ["downstream_step", *(f"downstream/{k}" for k in keys)] if keys else []
    names = _source_names(a)  # a mixture's sources: one `val/<name>` column each (the last evaluation's values)
    extra += [f"val/{n}" for n in names]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS + extra, lineterminator="\n")
    w.writeheader()
    for r in a.rows:
        run, m, sp = r.run, r.run.metrics, r.spike
        more = {"downstream_step": run.downstream_step, **{f"downstream/{k}": v for k, v in run.downstream.items()}}
        w.writerow({**(more if keys else {}), **{f"val/{n}": m.val_sources.get(n) for n in names},
            "run": run.rel, "size": run.size, "variant": run.variant, "seed": run.seed, "status": run.status,
            "category": run.category, "included": int(r.included), "note": r.note or run.reason,
            "flags": ";".join(run.flags), "params": _int_or_blank(run.params), "step": run.step,
            "tokens": run.tokens, "final_val_loss": run.final_val_loss, "best_val_loss": run.best_val_loss,
            "wall_s": run.wall_s, "train_points": m.train_points, "last_train_loss": m.last_train_loss,
            "val_points": m.val_points, "spike_score": sp.score if sp else None,
            "spikes": sp.spikes if sp else None, "nonfinite_losses": sp.nonfinite if sp else None,
            "relogged_steps": m.relogged, "bad_lines": m.bad_lines, "problems": "; ".join(run.problems),
        })
    return buf.getvalue()


def _int_or_blank(x: float | None) -> Any:
    return int(x) if x is not None and float(x).is_integer() else x


def _clean(x: Any) -> Any:
    """JSON-safe: NaN/inf become null, numpy scalars become Python numbers."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def summary(a: Analysis, plots: dict[str, dict[str, Any]], sweep_dir: str) -> dict[str, Any]:
    sizes = []
    for s in a.sizes:
        sizes.append({
            "size": s.size, "params": s.params,
            "variants": {v: dataclasses.asdict(vs) for v, vs in s.variants.items()},
            "comparisons": {b: dataclasses.asdict(c) for b, c in s.comparisons.items()},
        })
    trends = {}
    for b, tr in a.trends.items():
        d = dataclasses.asdict(tr)
        d.pop("fit")
        trends[b] = d
    return _clean({
        "sweep_dir": sweep_dir,
        "reference": a.reference,
        "baselines": a.baselines,
        "variants": a.variants,
        "options": dataclasses.asdict(a.options),
        "conventions": {
            "difference": "mean(baseline) - mean(reference); positive: reference has the lower loss",
            "test": "Welch two-sample t-test, two-sided, Welch-Satterthwaite df",
            "trend_x": "log10(params of the reference variant, mean over its runs at the size)",
            "spike_score": f"fraction of logged steps with loss > mean + {THRESHOLD_SD:g} SD of the previous {WINDOW}",
        },
        "runs": {
            "total": len(a.rows), "included": len(a.included),
            **{c: a.count(c) for c in ("ok", "flagged", "unfinished", "unusable")},
        },
        "sizes": sizes,
        "trends": trends,
        "notes": a.notes,
        "plots": plots,
        **({"downstream": downstream_summary(a)} if a.downstream is not None and a.downstream.tables else {}),
    })


def summary_json(a: Analysis, plots: dict[str, dict[str, Any]], sweep_dir: str) -> str:
    return json.dumps(summary(a, plots, sweep_dir), indent=2, allow_nan=False) + "\n"
