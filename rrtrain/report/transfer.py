"""The best learning rate against the width or the depth, per parametrization (`model.parametrization`,
docs/transfer.md): for a sweep whose grid has `train.lr` and whose runs take several shapes (sizes, or grid keys
such as `model.n_layers`), whether the base shape's best learning rate stays the best.

A line is one (variant, parametrization, the other grid keys' values); its shapes are its (width, depth, size), in
order of the width, then the depth. At each shape every learning rate is scored as the grid's selection scores a
point (`grid.score_point`, passed in: the mean final validation loss of the seeds < K, out where one of them
failed), the best is chosen, and the base shape is the line's first (smallest) shape with a choice. At every other shape:

    grid steps  |index of its best lr - index of the base's best| among the line's learning rates, sorted
    cost        (loss at the base's lr - loss at its own best) / loss at its own best, on the test seeds (>= K),
                the selection scores where no test seed ran (said in the line's note)

The line's learning rate transfers where every shape's best is within one grid step of the base's and the base's
learning rate costs at most 0.5% of loss at every shape (issue 47's criterion).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from rrtrain.report.collect import Run, seed_int

LR_KEY = "train.lr"
#: grid keys that make a run's shape or parametrization: a line runs across them, they are not its other keys
SHAPE_KEYS = ("model.d_model", "model.n_layers", "model.d_ff", "model.n_heads", "model.parametrization")
MAX_STEPS = 1  # grid steps between a shape's best learning rate and the base's, for transfer
MAX_COST = 0.005  # relative loss the base's learning rate may cost at a shape, for transfer


@dataclass
class ShapeBest:
    size: str
    width: int | None
    depth: int | None
    params: float | None  # mean parameter count of the chosen lr's runs
    scores: dict[float, float | None]  # lr -> selection score (None: out)
    tests: dict[float, float | None]  # lr -> mean final validation loss of the test seeds (None: none, or failed)
    best: float | None  # the chosen lr; None: every lr failed
    edge: bool = False  # the best is the smallest or largest lr tried at this shape
    steps: int | None = None  # grid steps from the base's best lr
    cost: float | None = None  # relative loss at the base's lr against this shape's own best
    own_loss: float | None = None  # the loss at its best and at the base's lr that `cost` compares (judge's)
    base_loss: float | None = None
    on_selection: bool = False  # those two are the selection seeds' (no test seed ran, or one failed)


@dataclass
class TransferLine:
    variant: str
    parametrization: str
    rest: dict[str, Any]  # the other grid keys' values
    axis: str  # "width", "depth" or "shape" (both change)
    lrs: list[float]  # every learning rate the line tried, sorted
    shapes: list[ShapeBest]
    base: ShapeBest | None = None
    holds: bool | None = None  # None: fewer than two shapes with a choice
    verdict: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in sorted(self.rest.items()))
        return f"{self.variant} ({self.parametrization}{', ' + extra if extra else ''})"


def applies(runs: list[Run]) -> bool:
    """A grid over the learning rate where a line takes two shapes or more."""
    return any(len(line.shapes) >= 2 for line in lines(runs, 1))


def has_shape_keys(keys: list[str]) -> bool:
    return any(k in SHAPE_KEYS for k in keys)


def _test_mean(members: list[Run], k: int) -> float | None:
    test = [r for r in members if (s := seed_int(r.seed)) is not None and s >= k]
    if not test or any(r.category != "ok" for r in test):
        return None
    return statistics.fmean(float(r.final_val_loss) for r in test)  # type: ignore[arg-type]


def lines(runs: list[Run], k: int, score: Callable[[dict[str, Any], list[Run], int], float | None]) -> list[TransferLine]:
    """Every line of the sweep's runs whose grid point has a learning rate, in first-seen order; `score`: a grid
    point's selection score (`grid.score_point`'s), None where it has none."""
    grouped: dict[tuple, dict[tuple, dict[float, list[Run]]]] = {}
    rests: dict[tuple, dict[str, Any]] = {}
    for r in runs:
        lr = r.point.get(LR_KEY)
        if r.variant is None or r.size is None or isinstance(lr, bool) or not isinstance(lr, (int, float)):
            continue
        rest = {key: v for key, v in r.point.items() if key != LR_KEY and key not in SHAPE_KEYS}
        lk = (r.variant, r.parametrization, tuple(sorted((key, repr(v)) for key, v in rest.items())))
        rests[lk] = rest
        shape = (r.width or 0, r.depth or 0, r.size)
        grouped.setdefault(lk, {}).setdefault(shape, {}).setdefault(float(lr), []).append(r)
    out = []
    for lk, shapes in grouped.items():
        lrs = sorted({lr for by_lr in shapes.values() for lr in by_lr})
        rows = []
        for (width, depth, size), by_lr in sorted(shapes.items()):
            scores = {lr: score({LR_KEY: lr}, members, k) for lr, members in sorted(by_lr.items())}
            tests = {lr: _test_mean(members, k) for lr, members in sorted(by_lr.items())}
            usable = [lr for lr, sc in scores.items() if sc is not None]
            best = min(usable, key=lambda lr: (scores[lr], lr)) if usable else None
            params = None
            if best is not None:
                ps = [r.params for r in by_lr[best] if r.params]
                params = statistics.fmean(ps) if ps else None
            edge = best is not None and len(scores) >= 2 and best in (min(scores), max(scores))
            rows.append(ShapeBest(size, width or None, depth or None, params, scores, tests, best, edge))
        widths, depths = {s.width for s in rows}, {s.depth for s in rows}
        axis = "width" if len(depths) == 1 and len(widths) > 1 else "depth" if len(widths) == 1 else "shape"
        line = TransferLine(lk[0], lk[1], rests[lk], axis, lrs, rows)
        judge(line)
        out.append(line)
    return out


def judge(line: TransferLine) -> None:
    """Each shape's grid steps and cost against the base (the first shape with a choice); the line's verdict."""
    chosen = [s for s in line.shapes if s.best is not None]
    for s in chosen:  # each shape's loss at its best and at the first shape's best (the base, when there are two)
        s.own_loss, s.base_loss = s.tests.get(s.best), s.tests.get(chosen[0].best)  # type: ignore[arg-type]
        if s.own_loss is None or s.base_loss is None:  # no test seed ran (or one failed): the selection scores
            s.own_loss, s.base_loss = s.scores.get(s.best), s.scores.get(chosen[0].best)  # type: ignore[arg-type]
            s.on_selection = True
    if len(chosen) < 2:
        line.verdict = "one shape with a best learning rate: nothing to transfer to"
        return
    base = line.base = chosen[0]
    index = {lr: i for i, lr in enumerate(line.lrs)}
    failures = []
    for s in line.shapes:
        if s is base:
            continue
        if s.best is None:
            failures.append(f"{shape_name(s, line.axis)}: every learning rate failed")
            continue
        s.steps = abs(index[s.best] - index[base.best])  # type: ignore[index]
        own, at_base = s.own_loss, s.base_loss
        s.cost = (at_base - own) / own if at_base is not None and own else None
        if s.steps > MAX_STEPS:
            failures.append(f"{shape_name(s, line.axis)}: best lr {s.best:.3g}, {s.steps} grid steps from the "
                            f"base's {base.best:.3g}")
        elif s.cost is None:
            failures.append(f"{shape_name(s, line.axis)}: the base's lr {base.best:.3g} failed or was not tried")
        elif s.cost > MAX_COST:
            failures.append(f"{shape_name(s, line.axis)}: the base's lr costs {100 * s.cost:.2f}% of loss")
    if any(s.on_selection for s in chosen if s is not base):
        line.notes.append("costs on the selection seeds, where no test seed ran: biased upward")
    line.holds = not failures
    base_name = shape_name(base, line.axis)
    line.verdict = (f"transfers: the base shape's ({base_name}) best lr {base.best:.3g} is within {MAX_STEPS} grid "
                    f"step of every shape's best and costs at most {100 * MAX_COST:g}% of loss" if line.holds
                    else f"does not transfer from {base_name} (best lr {base.best:.3g}): " + "; ".join(failures))


def shape_name(s: ShapeBest, axis: str) -> str:
    if axis == "width":
        return f"d_model {s.width}"
    if axis == "depth":
        return f"{s.depth} blocks"
    return f"{s.size} (d_model {s.width}, {s.depth} blocks)"


def fit_points(line: TransferLine) -> tuple[list[str], list[float], list[float]]:
    """(shape names, parameter counts, best lrs) of the shapes with a choice and a parameter count, by size."""
    pts = sorted((s for s in line.shapes if s.best is not None and s.params), key=lambda s: s.params or 0.0)
    return ([shape_name(s, line.axis) for s in pts], [float(s.params or 0.0) for s in pts],
            [float(s.best or 0.0) for s in pts])


def summary(tl: list[TransferLine]) -> list[dict[str, Any]]:
    """The lines as plain data (summary.json); NaN-free."""
    def num(x: float | None) -> float | None:
        return x if x is not None and math.isfinite(x) else None

    return [{"variant": t.variant, "parametrization": t.parametrization, "other_keys": t.rest, "axis": t.axis,
             "learning_rates": t.lrs, "holds": t.holds, "verdict": t.verdict, "notes": t.notes,
             "base": None if t.base is None else {"size": t.base.size, "width": t.base.width, "depth": t.base.depth,
                                                  "lr": t.base.best},
             "shapes": [{"size": s.size, "width": s.width, "depth": s.depth, "params": num(s.params),
                         "best_lr": s.best, "edge": s.edge, "grid_steps": s.steps, "cost": num(s.cost),
                         "scores": [[lr, num(v)] for lr, v in s.scores.items()],
                         "test_means": [[lr, num(v)] for lr, v in s.tests.items()]} for s in t.shapes]}
            for t in tl]
