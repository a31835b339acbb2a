"""From runs to numbers: per-size means, Welch tests, the trend across sizes, extrapolation and power.

`analyze(runs, Options(...))` returns an `Analysis` that `render` (markdown, CSV, JSON) and `plots`
only format; no statistic is computed anywhere else.

Conventions:
- a *difference* is `mean(baseline) − mean(reference)` of final validation loss: positive means the
  reference has the lower (better) loss, as the paper's "Rev − Hwy" column reads;
- a size's x-coordinate is the mean parameter count of the reference variant's runs at that size
  (parameter-matched baselines differ by < 0.5%); sizes are ordered by it;
- the trend is fitted against log10(parameters), so its slope is "nats per 10× parameters".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rrtrain.report import stats
from rrtrain.report.collect import Run
from rrtrain.report.options import Options, choose_variants
from rrtrain.report.spikes import SpikeScore


@dataclass
class RunRow:
    """A run with the report's verdict on it: whether it is in the means, and why not."""

    run: Run
    included: bool
    note: str
    spike: SpikeScore | None = None  # None when the run logged no training loss


@dataclass
class VariantStats:
    variant: str
    n: int
    seeds: list[Any]
    losses: list[float]
    mean: float | None
    sd: float | None  # sample SD (ddof = 1); None with fewer than 2 seeds
    best_mean: float | None
    params: float | None
    spike_score: float | None  # mean over this variant's finished runs at this size, flagged ones included
    spike_runs: int  # runs the spike score averages over
    spike_max: float | None
    flagged: int
    unfinished: int


@dataclass
class Power:
    effect: float | None  # nats
    effect_source: str  # "observed" or "--effect"
    sd: float | None  # pooled seed-to-seed SD
    d: float | None  # effect / sd
    seeds_needed: int | None  # per variant
    reason: str  # when seeds_needed is None


@dataclass
class Comparison:
    baseline: str
    n_ref: int
    n_base: int
    diff: float | None
    se: float | None = None
    t: float | None = None
    df: float | None = None
    p: float | None = None
    p_holm: float | None = None
    verdict: str = "n/a"  # "yes" (p < alpha), "no", "n/a"
    better: str | None = None  # the variant with the lower mean loss
    reason: str = ""
    power: Power | None = None


@dataclass
class SizeRow:
    size: str
    params: float | None
    variants: dict[str, VariantStats]
    comparisons: dict[str, Comparison]


@dataclass
class Extrapolation:
    params: float
    beyond: float  # params / largest trained size
    fit: float
    ci_lo: float | None
    ci_hi: float | None
    pi_lo: float | None
    pi_hi: float | None
    seeds_needed: int | None  # per variant, to detect `effect` at that size if the seed SD stays `sd`
    effect: float | None
    sd: float | None
    reason: str


@dataclass
class Trend:
    baseline: str
    sizes: list[str]
    params: list[float]
    diffs: list[float]
    ses: list[float | None]
    slope: float | None = None
    intercept: float | None = None
    se: float | None = None
    t: float | None = None
    df: int | None = None
    p: float | None = None
    weighted: bool = False
    slope_equal: float | None = None  # the equal-weight slope, to compare with a weighted one
    reason: str = ""
    extrapolation: list[Extrapolation] = field(default_factory=list)
    fit: stats.LineFit | None = None


@dataclass
class Analysis:
    options: Options
    reference: str
    baselines: list[str]
    variants: list[str]  # every variant present
    sizes: list[SizeRow]
    trends: dict[str, Trend]
    rows: list[RunRow]
    notes: list[str]
    #: the downstream-task tables over the same runs, set by `rrtrain.report.downstream.with_downstream` (which
    #: builds on this module's types); None: not asked for, or no run in the means has any
    downstream: Any = None  # a `rrtrain.report.downstream.Downstream` (not imported here: it imports this module)

    def count(self, category: str) -> int:
        return sum(r.run.category == category for r in self.rows)

    @property
    def included(self) -> list[RunRow]:
        return [r for r in self.rows if r.included]


def analyze(runs: list[Run], opts: Options) -> Analysis:
    rows, notes = _select(runs, opts)
    present = sorted({r.variant for r in runs if r.variant})
    reference, baselines = choose_variants(present, opts.reference, opts.baselines)
    sizes = _sizes(rows, present, reference, baselines, opts)
    _holm(sizes)
    trends = {b: _trend(sizes, reference, b, opts) for b in baselines}
    return Analysis(opts, reference, baselines, present, sizes, trends, rows, notes)


def _select(runs: list[Run], opts: Options) -> tuple[list[RunRow], list[str]]:
    rows: list[RunRow] = []
    for run in runs:
        cat = run.category
        usable = run.final_val_loss is not None
        if cat == "ok":
            included, note = True, ""
        elif cat == "flagged" and opts.include_flagged and usable:
            included, note = True, f"flagged ({run.reason}); included by --include-flagged"
        elif cat == "flagged" and opts.include_flagged:
            included, note = False, f"flagged ({run.reason}); no final_val_loss"
        else:
            included, note = False, run.reason
        rows.append(RunRow(run, included, note, run.metrics.spike))
    notes: list[str] = []
    # The same (size, variant, seed) twice would count one seed twice: keep the run that got furthest.
    groups: dict[tuple[Any, ...], list[RunRow]] = {}
    for row in rows:
        if row.included:
            groups.setdefault((row.run.size, row.run.variant, str(row.run.seed)), []).append(row)
    for (size, variant, seed), group in sorted(groups.items()):
        if len(group) < 2:
            continue
        keep = max(group, key=lambda r: (r.run.step or -1, r.run.rel))
        for row in group:
            if row is not keep:
                row.included = False
                row.note = f"duplicate of {size}/{variant}/seed {seed}; kept {keep.run.rel}"
        notes.append(f"{size} {variant} seed {seed} appears {len(group)} times; kept {keep.run.rel} (most steps)")
    return rows, notes


def _mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def _sizes(rows: list[RunRow], present: list[str], ref: str, baselines: list[str], opts: Options) -> list[SizeRow]:
    by_size: dict[str, list[RunRow]] = {}
    for row in rows:
        if row.run.size is not None and row.run.variant is not None:
            by_size.setdefault(row.run.size, []).append(row)
    out: list[SizeRow] = []
    for size, srows in by_size.items():
        variants = {v: _variant_stats(v, [r for r in srows if r.run.variant == v]) for v in present}
        variants = {v: s for v, s in variants.items() if s.n or s.flagged or s.unfinished or v in [ref, *baselines]}
        ref_params = [r.run.params for r in srows if r.run.variant == ref and r.run.params and r.included]
        ref_params = ref_params or [r.run.params for r in srows if r.run.variant == ref and r.run.params]
        all_params = [r.run.params for r in srows if r.run.params]
        x = _mean(ref_params) or _mean(all_params)
        comps = {b: _compare(variants[ref], variants[b], opts) for b in baselines}
        out.append(SizeRow(size, x, variants, comps))
    return sorted(out, key=lambda s: (s.params is None, s.params or 0.0, s.size))


def _variant_stats(variant: str, rows: list[RunRow]) -> VariantStats:
    inc = sorted((r for r in rows if r.included), key=lambda r: str(r.run.seed))
    losses = [float(r.run.final_val_loss) for r in inc]  # included runs always have one
    best = [r.run.best_val_loss for r in inc if r.run.best_val_loss is not None]
    finished = [r for r in rows if r.run.has_final and r.spike is not None and r.spike.score is not None]
    scores = [r.spike.score for r in finished]
    return VariantStats(
        variant=variant,
        n=len(inc),
        seeds=[r.run.seed for r in inc],
        losses=losses,
        mean=_mean(losses),
        sd=float(np.std(losses, ddof=1)) if len(losses) >= 2 else None,
        best_mean=_mean(best),
        params=_mean([r.run.params for r in inc if r.run.params]),
        spike_score=_mean(scores),
        spike_runs=len(scores),
        spike_max=max(scores) if scores else None,
        flagged=sum(r.run.category == "flagged" for r in rows),
        unfinished=sum(r.run.category == "unfinished" for r in rows),
    )


def _compare(ref: VariantStats, base: VariantStats, opts: Options) -> Comparison:
    c = Comparison(base.variant, ref.n, base.n, None)
    if not ref.n or not base.n:
        missing = [v.variant for v in (ref, base) if not v.n]
        c.reason = "no usable runs of " + " and ".join(missing)
        c.power = Power(opts.effect, "--effect" if opts.effect else "observed", None, None, None, c.reason)
        return c
    c.diff = base.mean - ref.mean  # type: ignore[operator]
    c.better = ref.variant if c.diff > 0 else base.variant if c.diff < 0 else None
    try:
        w = stats.welch(ref.losses, base.losses)
    except stats.NotApplicable as err:
        if ref.n < 2 or base.n < 2:
            c.reason = f"{ref.n} seed(s) of {ref.variant}, {base.n} of {base.variant}; Welch's test needs ≥ 2 on each side"
        else:
            c.reason = str(err)
    else:
        c.se, c.t, c.df, c.p = w.se, w.t, w.df, w.p
        c.verdict = "yes" if w.p < opts.alpha else "no"
    c.power = _power(ref, base, c.diff, opts)
    return c


def _power(ref: VariantStats, base: VariantStats, diff: float, opts: Options) -> Power:
    source = "--effect" if opts.effect is not None else "observed"
    effect = opts.effect if opts.effect is not None else abs(diff)
    p = Power(effect, source, None, None, None, "")
    try:
        p.sd = stats.pooled_sd([ref.losses, base.losses])
        if p.sd == 0.0:
            raise stats.NotApplicable("no seed-to-seed spread observed")
        p.d = effect / p.sd
        p.seeds_needed = stats.seeds_needed(p.d, opts.alpha, opts.power)
    except stats.NotApplicable as err:
        p.reason = str(err)
    return p


def _holm(sizes: list[SizeRow]) -> None:
    comps = [c for s in sizes for c in s.comparisons.values()]
    adjusted = stats.holm([c.p if c.p is not None else math.nan for c in comps])
    for c, q in zip(comps, adjusted):
        c.p_holm = q if math.isfinite(q) else None


def _trend(sizes: list[SizeRow], ref: str, base: str, opts: Options) -> Trend:
    pts = [(s, s.comparisons[base]) for s in sizes if s.params and s.comparisons[base].diff is not None]
    tr = Trend(
        base,
        sizes=[s.size for s, _ in pts],
        params=[float(s.params) for s, _ in pts],  # type: ignore[arg-type]
        diffs=[float(c.diff) for _, c in pts],  # type: ignore[arg-type]
        ses=[c.se for _, c in pts],
    )
    ses = [se for se in tr.ses if se]
    weights = [1.0 / se**2 for se in ses] if len(ses) == len(pts) else None
    try:
        fit = stats.wls(np.log10(tr.params), tr.diffs, weights)
    except stats.NotApplicable as err:
        tr.reason = str(err)
        return tr
    tr.fit = fit
    tr.slope_equal = fit.slope if weights is None else stats.wls(np.log10(tr.params), tr.diffs).slope
    tr.slope, tr.intercept, tr.df, tr.weighted = fit.slope, fit.intercept, fit.df, fit.weighted
    if fit.df >= 1:
        tr.se, tr.t, tr.p = fit.se_slope, fit.t, fit.p
    else:
        tr.reason = "2 sizes: the slope has no standard error (needs ≥ 3)"
    if weights is None and len(pts) >= 2:
        tr.reason = tr.reason or "some sizes have fewer than 2 seeds on a side, so no SE to weight by"
    # seed SD for planning at a new size: the pooled SD at the largest size that has one
    sd = None
    for s in reversed(sizes):
        pw = s.comparisons[base].power
        if pw is not None and pw.sd:
            sd = pw.sd
            break
    largest = max(tr.params)
    for target in opts.extrapolate:
        pred = fit.predict(math.log10(target))
        effect = opts.effect if opts.effect is not None else pred["fit"]
        e = Extrapolation(
            params=target,
            beyond=target / largest,
            fit=pred["fit"],
            ci_lo=_finite(pred["ci_lo"]),
            ci_hi=_finite(pred["ci_hi"]),
            pi_lo=_finite(pred["pi_lo"]),
            pi_hi=_finite(pred["pi_hi"]),
            seeds_needed=None,
            effect=effect,
            sd=sd,
            reason="",
        )
        if effect <= 0:
            e.reason = f"the fit predicts no advantage for {ref}"
        elif sd is None:
            e.reason = "no seed-to-seed spread measured at any size"
        else:
            try:
                e.seeds_needed = stats.seeds_needed(effect / sd, opts.alpha, opts.power)
            except stats.NotApplicable as err:
                e.reason = str(err)
        tr.extrapolation.append(e)
    return tr


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
