"""Downstream-task tables: per task and primary metric, each variant's mean ± SD over seeds per size and Welch's
test against the reference, as the loss table has them, on the same runs.

The runs are the loss table's (`Analysis.rows` in the means; in a sweep with a grid, the test seeds at each
variant's point chosen by the loss), each with its final downstream values (`Run.downstream`: the largest step
that has any, `rrtrain.rundir.downstream`). A run in the loss means without a value of a metric is left out of that
metric's mean and counted.

Which metrics: a task's primary ones, `acc` and `acc_norm` (multiple choice, higher is better) when it has either,
else `bits_per_byte` and `word_perplexity` (perplexity tasks, lower is better), else every metric whose direction
is known (`HIGHER`, `LOWER`); the others are listed, not tested. Direction decides which variant is "better":
the difference is always `mean(baseline) − mean(reference)`, and for a higher-is-better metric a negative one
favours the reference.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field

import numpy as np

from rrtrain.report import stats
from rrtrain.report.analysis import Analysis, Comparison, SizeRow, VariantStats
from rrtrain.rundir.downstream import split_key

HIGHER = frozenset({"acc", "acc_norm", "exact_match", "em", "f1", "mcc", "mc1", "mc2", "bleu", "rouge1", "rouge2",
                    "rougeL", "contains"})
LOWER = frozenset({"perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte", "loss", "brier_score", "ter"})
#: the primary metrics, in order of preference: the first group a task has any of is tabled
PRIMARY = (("acc", "acc_norm"), ("bits_per_byte", "word_perplexity"))


@dataclass
class MetricTable:
    """One task and metric: its own `Analysis` (reference, baselines, per-size variant stats and comparisons) that
    `rrtrain.report.render` formats as it formats the loss table."""

    task: str
    metric: str
    higher_better: bool
    analysis: Analysis
    steps: dict[int, int]  # the runs' final downstream step -> how many runs
    missing: int  # runs in the loss means without this metric


@dataclass
class Downstream:
    tables: list[MetricTable] = field(default_factory=list)
    untested: list[str] = field(default_factory=list)  # "TASK/METRIC" found but not tabled
    why: dict[str, str] = field(default_factory=dict)  # task -> which metrics, in words


def higher_is_better(metric: str) -> bool | None:
    """True / False for a metric whose direction is known (a filtered one by its name before the filter's:
    `exact_match.strict-match` as `rrtrain eval` writes it, `exact_match,strict-match` as lm-eval does), None
    otherwise."""
    name = re.split(r"[,.]", metric, maxsplit=1)[0]
    return True if name in HIGHER else False if name in LOWER else None


def primary(metrics: set[str]) -> tuple[list[str], str]:
    """The metrics of a task to table, and why (in words)."""
    for group in PRIMARY:
        got = [m for m in group if m in metrics]
        if got:
            kind = "multiple choice" if group == PRIMARY[0] else "perplexity"
            return got, f"{kind}: {' and '.join(got)}"
    known = sorted(m for m in metrics if higher_is_better(m) is not None)
    return known, ("its metrics of known direction: " + ", ".join(known)) if known else "no metric of known direction"


def with_downstream(a: Analysis | None) -> Analysis | None:
    """`a` with its downstream tables (`a.downstream`), when a run in its means has downstream values."""
    if a is not None and any(r.included and r.run.downstream for r in a.rows):
        a.downstream = analyze_downstream(a)
    return a


def analyze_downstream(a: Analysis) -> Downstream:
    """The tables of every task's primary metrics over `a`'s runs in the means (none without downstream values)."""
    included = [r.run for r in a.rows if r.included]
    keys = sorted({k for run in included for k in run.downstream})
    out = Downstream()
    by_task: dict[str, set[str]] = {}
    for key in keys:
        task, metric = split_key(key)
        by_task.setdefault(task, set()).add(metric)
    for task, metrics in sorted(by_task.items()):
        chosen, why = primary(metrics)
        out.why[task] = why
        out.untested += [f"{task}/{m}" for m in sorted(metrics - set(chosen))]
        for metric in chosen:
            out.tables.append(_table(a, included, task, metric))
    _holm([c for t in out.tables for s in t.analysis.sizes for c in s.comparisons.values()])
    return out


def _table(a: Analysis, included: list, task: str, metric: str) -> MetricTable:
    key, higher = f"{task}/{metric}", bool(higher_is_better(metric))
    sizes: list[SizeRow] = []
    steps: dict[int, int] = {}
    missing = 0
    for s in a.sizes:
        runs = [r for r in included if r.size == s.size]
        variants = {}
        for v in [a.reference, *a.baselines]:
            mine = sorted((r for r in runs if r.variant == v), key=lambda r: str(r.seed))
            have = [r for r in mine if key in r.downstream]
            missing += len(mine) - len(have)
            for r in have:
                steps[r.downstream_step] = steps.get(r.downstream_step, 0) + 1
            variants[v] = _stats(v, [r.seed for r in have], [r.downstream[key] for r in have])
        comps = {b: compare(variants[a.reference], variants[b], a.options.alpha, higher) for b in a.baselines}
        sizes.append(SizeRow(s.size, s.params, variants, comps))
    sub = Analysis(a.options, a.reference, list(a.baselines), list(a.variants), sizes, {}, [], [])
    return MetricTable(task, metric, higher, sub, dict(sorted(steps.items())), missing)


def _stats(variant: str, seeds: list, values: list[float]) -> VariantStats:
    return VariantStats(variant=variant, n=len(values), seeds=seeds, losses=values,
                        mean=float(np.mean(values)) if values else None,
                        sd=float(np.std(values, ddof=1)) if len(values) >= 2 else None,
                        best_mean=None, params=None, spike_score=None, spike_runs=0, spike_max=None,
                        flagged=0, unfinished=0)


def compare(ref: VariantStats, base: VariantStats, alpha: float, higher: bool) -> Comparison:
    """Welch's test of `base` against `ref` (`stats.welch`, as the loss table); `better` by the metric's
    direction."""
    c = Comparison(base.variant, ref.n, base.n, None)
    if not ref.n or not base.n:
        c.reason = "no values of " + " and ".join(v.variant for v in (ref, base) if not v.n)
        return c
    c.diff = base.mean - ref.mean  # type: ignore[operator]
    ahead = c.diff > 0 if higher else c.diff < 0  # the baseline's mean is the better one
    c.better = None if c.diff == 0 else base.variant if ahead else ref.variant
    try:
        with warnings.catch_warnings():
            # an accuracy on a few documents is often the same on every seed of a side: scipy warns of "precision
            # loss" for a side without spread, and its t (from the other side's spread) is right all the same
            warnings.simplefilter("ignore", RuntimeWarning)
            w = stats.welch(ref.losses, base.losses)
    except stats.NotApplicable as err:
        c.reason = (f"{ref.n} seed(s) of {ref.variant}, {base.n} of {base.variant}; Welch's test needs ≥ 2 on each "
                    "side") if ref.n < 2 or base.n < 2 else str(err)
        return c
    c.se, c.t, c.df, c.p = w.se, w.t, w.df, w.p
    c.verdict = "yes" if w.p < alpha else "no"
    return c


def _holm(comps: list[Comparison]) -> None:
    """Holm over every downstream test of the report (one family, apart from the loss table's)."""
    adjusted = stats.holm([c.p if c.p is not None else math.nan for c in comps])
    for c, q in zip(comps, adjusted):
        c.p_holm = q if math.isfinite(q) else None
