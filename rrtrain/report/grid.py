"""A sweep with a grid (`grid:`): each variant at its own best setting, by a rule that never tests on the numbers
it selected with, next to every variant at one shared setting; and the best learning rate across sizes.

Selection (`--select-seeds K`, default 1): per (size, variant), each grid point is scored by the mean final
validation loss of its runs with seed < K; a point is out when one of those runs did not complete cleanly
(diverged, stalled, failed, flagged, unfinished). The point with the lowest score is chosen. The tables then use
only the seeds >= K, at the chosen points (`selected`) and at the shared point (`shared`), so no loss a test sees
took part in choosing its setting. A (size, variant) with no point left is reported as failing at every point.

The learning-rate fit: where `train.lr` is a grid key and at least two sizes of a variant chose a point,
log10(lr) = log10(a) + b·log10(N) by least squares (N: the chosen runs' parameter count), with a t interval for b
(three sizes or more) and, at each larger size, the suggested lr with its prediction interval.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rrtrain.core import files
from rrtrain.report import stats, transfer
from rrtrain.report.analysis import Analysis, analyze
from rrtrain.report.collect import Run, seed_int
from rrtrain.report.options import Options
from rrtrain.report.transfer import TransferLine
from rrtrain.rundir.points import point_label

LR_KEY = "train.lr"
#: the parametrizations under which the base shape's best lr is meant to be every size's (docs/transfer.md)
TRANSFERRING = ("mup", "completep")


@dataclass
class PointScore:
    point: dict[str, Any]
    score: float | None  # mean final val loss of the selection seeds; None when the point is out
    select_seeds: list[Any]
    why_out: str  # why the point has no score
    statuses: dict[str, str]  # seed -> what happened (`completed`, `diverged`, ...), every seed of the point


@dataclass
class GroupChoice:
    size: str
    variant: str
    points: list[PointScore]
    chosen: dict[str, Any] | None  # None: the variant failed at every point of this size
    params: float | None  # mean parameter count of the chosen point's runs (any seed)
    #: numeric keys whose chosen value is the smallest or largest tried: the best may lie beyond the grid
    edge: list[str] = field(default_factory=list)
    #: the chosen point's runs' model.parametrization ("mixed" where they differ)
    parametrization: str = "sp"

    @property
    def failed_everywhere(self) -> bool:
        return self.chosen is None


@dataclass
class LrPrediction:
    size: str
    params: float
    lr: float
    pi_lo: float | None
    pi_hi: float | None


@dataclass
class LrFit:
    variant: str
    sizes: list[str]
    params: list[float]
    lrs: list[float]
    a: float | None = None  # lr = a * N**b
    b: float | None = None
    b_lo: float | None = None
    b_hi: float | None = None
    reason: str = ""
    predictions: list[LrPrediction] = field(default_factory=list)
    parametrization: str = "sp"
    other: str = ""  # the other grid keys' values of a transfer line (`rrtrain.report.transfer`)
    #: under mup/completep, the base shape's best lr: what the parametrization says transfers to every size
    base_lr: float | None = None
    #: whether the sweep measured it to transfer (`transfer.TransferLine.holds`); None: not measured
    transfers: bool | None = None
    #: (size, parameters) beyond the fitted ones (the sweep's larger sizes, --lr-for) that base_lr is claimed for
    base_for: list[tuple[str, float]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.variant} ({self.parametrization}{', ' + self.other if self.other else ''})"


@dataclass
class GridAnalysis:
    rule: str  # the selection rule, in words
    select_seeds: int
    keys: list[str]
    groups: list[GroupChoice]
    shared: dict[str, Any]
    shared_source: str
    selected: Analysis | None  # the paper's table at each variant's chosen point, on seeds >= K
    at_shared: Analysis | None  # the same at the shared point
    lr_fits: list[LrFit]
    notes: list[str]
    #: the best lr against the width or depth per parametrization (`rrtrain.report.transfer`); [] where no line of
    #: the grid takes two shapes
    transfer: list[TransferLine] = field(default_factory=list)


def has_grid(runs: list[Run]) -> bool:
    return any(r.point for r in runs)


def _key(point: dict[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in point.items()))


def rule_text(k: int, pruned: bool = False) -> str:
    """The selection rule in words; with pruned runs, what pruning (which ranks every seed) took part in."""
    sel = "seed 0" if k == 1 else f"seeds 0–{k - 1}"
    text = (f"per size and variant, the grid point with the lowest mean final validation loss on {sel} "
            f"(a point where one of those runs diverged, stalled, failed or did not finish is out); the tables "
            f"use only seeds ≥ {k}, so no number tested took part in the choice (`--select-seeds {k}`)")
    if pruned:
        text += (f". The sweep pruned points by the mean of all their seeds at its rungs: the values of seeds ≥ {k} "
                 "before the end took part in which points reached it; their final values did not")
    return text


def choose(runs: list[Run], k: int) -> list[GroupChoice]:
    """Per (size, variant) in first-seen order: every point's selection score and the chosen point."""
    groups: dict[tuple[str, str], dict[tuple, list[Run]]] = {}
    points: dict[tuple, dict[str, Any]] = {}
    for r in runs:
        if r.size is None or r.variant is None:
            continue
        pk = _key(r.point)
        points[pk] = r.point
        groups.setdefault((r.size, r.variant), {}).setdefault(pk, []).append(r)
    out = []
    for (size, variant), by_point in groups.items():
        scores = sorted((score_point(points[pk], members, k) for pk, members in by_point.items()),
                        key=lambda p: _key(p.point))
        usable = [p for p in scores if p.score is not None]
        chosen = min(usable, key=lambda p: (p.score, _key(p.point))).point if usable else None
        params, param = None, "sp"
        if chosen is not None:
            at = by_point[_key(chosen)]
            ps = [r.params for r in at if r.params]
            params = statistics.fmean(ps) if ps else None
            kinds = {r.parametrization for r in at}
            param = kinds.pop() if len(kinds) == 1 else "mixed"
        out.append(GroupChoice(size, variant, scores, chosen, params, _at_edge(chosen, [p.point for p in scores]),
                               param))
    return out


def score_point(point: dict[str, Any], members: list[Run], k: int) -> PointScore:
    """One grid point's selection score: the mean final validation loss of its runs with seed < k, None (with why)
    when there is none or one of them did not complete cleanly."""
    sel = [r for r in members if (s := seed_int(r.seed)) is not None and s < k]
    statuses = {str(r.seed): (r.status if r.category != "unusable" else "unusable") if r.has_final
                else "unfinished" for r in sorted(members, key=lambda r: str(r.seed))}
    bad = [r for r in sel if r.category != "ok"]
    if not sel:
        why = f"no run with seed < {k}"
    elif bad:
        why = "; ".join(f"seed {r.seed}: {r.reason}" for r in bad)
    else:
        why = ""
    score = statistics.fmean(float(r.final_val_loss) for r in sel) if sel and not bad else None
    return PointScore(point, score, sorted(r.seed for r in sel), why, statuses)


def _at_edge(chosen: dict[str, Any] | None, tried: list[dict[str, Any]]) -> list[str]:
    if chosen is None:
        return []
    out = []
    for key, value in sorted(chosen.items()):
        values = {p[key] for p in tried if key in p}
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        if numeric and len(values) >= 2 and value in (min(values), max(values)):
            out.append(key)
    return out


def middle_point(runs: list[Run]) -> dict[str, Any]:
    """Per grid key, the middle of the values tried (the lower middle of an even count), sorted as numbers."""
    values: dict[str, set] = {}
    for r in runs:
        for k, v in r.point.items():
            values.setdefault(k, set()).add(v)
    out = {}
    for k, vs in values.items():
        ordered = sorted(vs, key=lambda v: (not isinstance(v, (int, float)),
                                            v if isinstance(v, (int, float)) else str(v)))
        out[k] = ordered[(len(ordered) - 1) // 2]
    return out


def parse_shared(text: str, runs: list[Run]) -> dict[str, Any]:
    """`--shared train.lr=3e-3,train.warmup_steps=10` -> a point, each value matched to a value tried."""
    from rrtrain.core.errors import UsageError

    tried: dict[str, set] = {}
    for r in runs:
        for k, v in r.point.items():
            tried.setdefault(k, set()).add(v)
    out: dict[str, Any] = {}
    for part in text.split(","):
        key, eq, raw = part.strip().partition("=")
        if not eq or not key:
            raise UsageError(f"--shared: {part.strip()!r} is not KEY=VALUE (e.g. train.lr=3e-3)")
        if key not in tried:
            raise UsageError(f"--shared: {key!r} is not a grid key of these runs "
                             f"({', '.join(sorted(tried)) or 'none'})")
        match = [v for v in tried[key] if str(v) == raw or _same_number(v, raw)]
        if not match:
            raise UsageError(f"--shared: {key}={raw} was not tried; tried: {', '.join(sorted(map(str, tried[key])))}")
        out[key] = match[0]
    missing = sorted(set(tried) - set(out))
    if missing:
        raise UsageError(f"--shared: give a value for every grid key; missing: {', '.join(missing)}")
    return out


def _same_number(v: Any, raw: str) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isclose(float(v), float(raw), rel_tol=1e-12)
    except ValueError:
        return False


def _test_runs(runs: list[Run], k: int, at: dict[tuple[str, str], tuple]) -> list[Run]:
    """The runs with seed >= k at the given point of each (size, variant); the point is forgotten (the analysis
    groups by size and variant)."""
    out = []
    for r in runs:
        s = seed_int(r.seed)
        if s is None or s < k or (r.size, r.variant) not in at:
            continue
        if _key(r.point) == at[(r.size, r.variant)]:
            out.append(r)
    return out


def _analyze_or_none(runs: list[Run], opts: Options, notes: list[str], what: str) -> Analysis | None:
    from rrtrain.core.errors import UsageError

    present = {r.variant for r in runs if r.variant}
    if not runs or (opts.reference is not None and opts.reference not in present):
        notes.append(f"no table {what}: no run of the reference there")
        return None
    baselines = [b for b in opts.baselines if b in present] if opts.baselines is not None else None
    try:
        return analyze(runs, replace(opts, baselines=baselines))
    except UsageError as err:
        notes.append(f"no table {what}: {err}")
        return None


def analyze_grid(runs: list[Run], opts: Options, sweep_dir: Path | None = None) -> GridAnalysis:
    k = opts.select_seeds
    notes: list[str] = []
    grid_runs = [r for r in runs if r.size is not None and r.variant is not None]
    groups = choose(grid_runs, k)
    if opts.shared is not None:
        shared, source = parse_shared(opts.shared, grid_runs), "named with --shared"
    else:
        shared, source = middle_point(grid_runs), "the middle value of each grid key; name another with --shared"
    selected_at = {(g.size, g.variant): _key(g.chosen) for g in groups if g.chosen is not None}
    shared_at = {(g.size, g.variant): _key(shared) for g in groups}
    if not any(seed_int(r.seed) is not None and seed_int(r.seed) >= k for r in grid_runs):
        notes.append(f"no run has a seed ≥ {k}: nothing is left to test on (run more seeds, or lower --select-seeds)")
    selected = _analyze_or_none(_test_runs(grid_runs, k, selected_at), opts, notes, "at the selected settings")
    at_shared = _analyze_or_none(_test_runs(grid_runs, k, shared_at), opts, notes, "at the shared setting")
    for g in groups:
        if g.edge:
            notes.append(f"{g.size} {g.variant}: the chosen {', '.join(g.edge)} is at the edge of the values tried; "
                         "the best may lie beyond them (widen the grid)")
    keys = sorted({key for r in grid_runs for key in r.point})
    tl = [t for t in transfer.lines(grid_runs, k, lambda p, m, n: score_point(p, m, n).score) if len(t.shapes) >= 2] if LR_KEY in keys else []
    fits = []
    if LR_KEY in keys:  # a grid over the shape or the parametrization: a fit per transfer line
        fits = lr_fits(groups, opts, sweep_dir, notes, tl if transfer.has_shape_keys(keys) else None)
    pruned = any(r.status == "pruned" for r in grid_runs)
    return GridAnalysis(rule_text(k, pruned), k, keys, groups, shared, source, selected, at_shared, fits, notes, tl)


# -- the learning rate across sizes ------------------------------------------------------------------------


def fit_power_law(params: list[float], lrs: list[float], level: float = 0.95) -> tuple[stats.LineFit, float | None]:
    """lr = a·N^b by least squares in log10-log10: the line fit and the half-width of b's `level` interval
    (None with two sizes)."""
    import scipy.stats as sps

    fit = stats.wls([math.log10(n) for n in params], [math.log10(x) for x in lrs])
    half = None
    if fit.df >= 1 and math.isfinite(fit.se_slope):
        half = float(sps.t.ppf(0.5 + level / 2, fit.df)) * fit.se_slope
    return fit, half


def lr_fits(groups: list[GroupChoice], opts: Options, sweep_dir: Path | None, notes: list[str],
            lines: list[TransferLine] | None = None) -> list[LrFit]:
    """lr = a·N^b per variant and parametrization over the sizes' chosen points, or per transfer line over its
    shapes (`lines`: a grid over the shape or the parametrization); under mup/completep with the base shape's lr,
    which the parametrization says transfers, beside the law."""
    out = []
    edges: dict[int, list[str]] = {}
    if lines is not None:
        for t in lines:
            names, params, lrs = transfer.fit_points(t)
            if names:
                f = LrFit(t.variant, names, params, lrs, parametrization=t.parametrization,
                          other=" ".join(f"{k}={v}" for k, v in sorted(t.rest.items())), transfers=t.holds,
                          base_lr=t.base.best if t.base is not None else lrs[0])
                edges[id(f)] = [transfer.shape_name(s, t.axis) for s in t.shapes if s.edge]
                out.append(f)
    else:
        by_variant: dict[tuple[str, str], list[GroupChoice]] = {}
        for g in groups:
            if g.chosen is not None and LR_KEY in g.chosen and g.params:
                by_variant.setdefault((g.variant, g.parametrization), []).append(g)
        for (variant, param), gs in sorted(by_variant.items()):
            gs = sorted(gs, key=lambda g: g.params or 0.0)
            f = LrFit(variant, [g.size for g in gs], [float(g.params) for g in gs],  # type: ignore[arg-type]
                      [float(g.chosen[LR_KEY]) for g in gs], parametrization=param)  # type: ignore[index]
            edges[id(f)] = [g.size for g in gs if LR_KEY in g.edge]
            out.append(f)
    targets = larger_sizes(sweep_dir, opts, notes)
    for f in out:
        if f.parametrization in TRANSFERRING:  # the base shape's lr is the one that should carry over
            f.base_lr = f.base_lr if f.base_lr is not None else f.lrs[0]  # the smallest size's
            f.base_for = [(name, n) for name, n in targets if n > max(f.params) and name not in f.sizes]
        else:
            f.base_lr = None
        if len(f.sizes) < 2:
            f.reason = "one size: a fit needs the best lr at two sizes or more"
            continue
        try:
            fit, half = fit_power_law(f.params, f.lrs)
        except stats.NotApplicable as err:
            f.reason = str(err)
            continue
        f.a, f.b = 10 ** fit.intercept, fit.slope
        reasons = []
        if half is not None:
            f.b_lo, f.b_hi = fit.slope - half, fit.slope + half
        else:
            reasons.append("two sizes: the line goes through both, so b has no interval (needs three sizes)")
        edge = edges[id(f)]
        if edge:
            reasons.append(f"the best lr at {', '.join(edge)} is at the edge of the grid: the fit may be off")
        f.reason = "; ".join(reasons)
        largest = max(f.params)
        for name, n in targets:
            if n <= largest or name in f.sizes:
                continue
            pred = fit.predict(math.log10(n))
            lo, hi = pred["pi_lo"], pred["pi_hi"]
            f.predictions.append(LrPrediction(name, n, 10 ** pred["fit"], 10 ** lo if math.isfinite(lo) else None,
                                              10 ** hi if math.isfinite(hi) else None))
    return out


def larger_sizes(sweep_dir: Path | None, opts: Options, notes: list[str]) -> list[tuple[str, float]]:
    """(name, parameter count) of the sweep's sizes (SWEEP_DIR/sweep.json, as untrusted data) and of
    `--lr-for`: the sizes the fit suggests a learning rate for."""
    out: dict[str, float] = {}
    rec = _read_sweep_json(sweep_dir) if sweep_dir is not None else None
    configs: dict[str, dict] = {}
    for entry in (rec or {}).get("runs", {}).values() if isinstance(rec, dict) else []:
        if isinstance(entry, dict) and isinstance(entry.get("size"), str) and isinstance(entry.get("config"), dict):
            configs.setdefault(entry["size"], entry["config"])
    for size, cfg in configs.items():
        n = _params_of(cfg)
        if n is None:
            notes.append(f"size {size} of sweep.json: its parameter count could not be worked out")
        else:
            out[size] = n
    for name, n in opts.lr_for:
        out[name] = n
    return sorted(out.items(), key=lambda kv: kv[1])


def _read_sweep_json(sweep_dir: Path) -> dict | None:
    try:
        data = json.loads(files.read_beneath(sweep_dir, "sweep.json", "record"))  # no link, no FIFO, bounded
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("runs"), dict) else None


def _params_of(config: dict) -> float | None:
    """A recorded run config's parameter count, resolved as the trainer resolves it (None when it cannot be)."""
    from rrtrain.config import Config
    from rrtrain.config_load import build
    from rrtrain.core.errors import UsageError
    from rrtrain.data.manifest import prepared_manifest
    from rrtrain.resolve import resolve

    try:
        cfg = build(Config, config)
        return float(resolve(cfg, prepared_manifest(cfg.data.path)).params)
    except (UsageError, KeyError, TypeError, ValueError, OSError):
        return None


def size_params(name: str) -> float:
    """A size preset's parameter count (the standard rule, unmatched), for `--lr-for PRESET`."""
    from rrtrain.config import Config
    from rrtrain.config_load import build
    from rrtrain.resolve import resolve

    cfg = build(Config, {"model": {"size": name, "variant": "standard"}})
    return float(resolve(cfg).params)


def describe_point(point: dict[str, Any] | None) -> str:
    return point_label(point) if point is not None else "none (failed at every point)"
