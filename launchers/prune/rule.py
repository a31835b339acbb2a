"""Successive halving across a sweep's grid, as a pure function: which runs go on (and to which step), which
are pruned, which wait. No files here: `launchers.prune.rungs` observes the runs and applies the plan.

The rule (synchronous halving, driven by `rrtrain sweep`; docs/cluster.md, "Pruning"):

- A *group* is the runs of one (size, variant); a *point* is a run's setting, every training key but the seed
  (and the run's name and directory): the seeds of a point are ranked together, by the mean of their values.
- Every run of a group goes to rung 1 (it pauses there, `pause.json`); once every run of every live point of the
  group has reached the rung (paused there, or further), the live points are ranked by the smoothed metric at
  the rung, lowest first. The best `ceil(keep x live points)` (at least one) go on to the next rung, with every
  point tied with the last of them; the others' paused runs are `pruned`. After the last rung the survivors
  train to their end.
- A run that diverged or stalled at or before a rung drops out of that rung: a point whose seeds all did is
  not ranked and takes no place among the kept ("stalled and diverged runs free their slot"); a group whose
  points all did is finished. A non-finite value ranks last.
- A run is never stopped behind a rung it already passed (a run past the rung, kept under an earlier setting of
  `prune`, goes on), and the decisions are a function of the values at the rungs: running the sweep again
  decides the same; raising `keep` (or removing `prune`) resumes the runs it pruned, exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

#: the states the planner sees a run in (from its files and the scheduler)
ACTIVE, IDLE, COMPLETED, DEAD = "active", "idle", "completed", "dead"


@dataclass(frozen=True)
class Member:
    """One run as the ladder sees it."""

    id: str
    group: tuple[str, str]  # (size, variant)
    point: str  # its setting, as a label unique in its group (`train.lr=0.003`)
    rungs: tuple[int, ...]  # the steps of its rungs
    total: int  # its steps


@dataclass(frozen=True)
class Seen:
    """What a run's files and the scheduler say: ACTIVE (queued or running), IDLE (new, paused, pruned, failed,
    preempted: it trains only when submitted), COMPLETED, or DEAD (diverged or stalled). `step`: the step its
    final.json names (0: none); `status`: that final.json's status."""

    state: str
    step: int = 0
    status: Optional[str] = None


@dataclass(frozen=True)
class Ranked:
    point: str
    value: float  # the mean over its seeds at the rung; inf for a non-finite one
    kept: bool


@dataclass(frozen=True)
class Decision:
    """One rung of one group, decided."""

    group: tuple[str, str]
    rung: int  # 1-based
    steps: tuple[int, ...]  # the rung's step for the group's runs (one, unless their budgets differ)
    ranking: tuple[Ranked, ...]  # best first
    dropped: tuple[str, ...]  # points whose runs all diverged or stalled at or before the rung


@dataclass
class Plan:
    go: dict[str, Optional[int]] = field(default_factory=dict)  # run id -> the step it pauses at (None: its end)
    prune: dict[str, dict] = field(default_factory=dict)  # run id -> its rung record (a paused run to prune now)
    waiting: dict[str, str] = field(default_factory=dict)  # run id -> why it waits (its group is not at the rung)
    decisions: list[Decision] = field(default_factory=list)


def keep_count(live: int, keep: float) -> int:
    """How many of `live` points a rung keeps: `keep` of them rounded up, at least one (none of none). The
    product is rounded to 9 digits first, so that 0.1 x 30 keeps 3, not 4."""
    return 0 if live <= 0 else max(1, math.ceil(round(keep * live, 9)))


def _order(value: float) -> float:
    return value if math.isfinite(value) else math.inf


def select(scores: dict[str, float], keep: float) -> list[Ranked]:
    """The points ranked best first (by value, then by label: the same order every time), each marked kept or
    not: the first `keep_count` and every point whose finite value ties with the last of them."""
    order = sorted(scores, key=lambda p: (_order(scores[p]), p))
    n = keep_count(len(order), keep)
    cut = _order(scores[order[n - 1]]) if n else math.inf
    return [Ranked(p, _order(scores[p]), i < n or (math.isfinite(cut) and _order(scores[p]) == cut))
            for i, p in enumerate(order)]


def plan(members: list[Member], seen: dict[str, Seen], value: Callable[[Member, int], float], keep: float,
         metric: str = "loss") -> Plan:
    """The next moves of every group (see the module's rule). `value(member, step)`: the member's smoothed
    metric at that step (inf when it has none or it is not finite)."""
    out = Plan()
    groups: dict[tuple[str, str], dict[str, list[Member]]] = {}
    for m in members:
        groups.setdefault(m.group, {}).setdefault(m.point, []).append(m)
    for group, points in groups.items():
        _plan_group(group, points, seen, value, keep, metric, out)
    return out


def _reached(m: Member, s: Seen, rung: int) -> bool:
    step = m.rungs[rung]
    if s.state == COMPLETED:
        return True
    return s.step > step if s.state == DEAD else s.step >= step


def _dead_before(m: Member, s: Seen, rung: int) -> bool:
    return s.state == DEAD and s.step <= m.rungs[rung]


def _plan_group(group: tuple[str, str], points: dict[str, list[Member]], seen: dict[str, Seen],
                value: Callable[[Member, int], float], keep: float, metric: str, out: Plan) -> None:
    survivors = sorted(points)
    n_rungs = min(len(m.rungs) for ms in points.values() for m in ms)
    for k in range(n_rungs):
        runs = [m for p in survivors for m in points[p]]
        pending = [m for m in runs if not _reached(m, seen[m.id], k) and not _dead_before(m, seen[m.id], k)]
        if pending:
            for m in pending:
                if seen[m.id].state == IDLE:
                    out.go[m.id] = m.rungs[k]
            for m in runs:
                s = seen[m.id]
                if m not in pending and s.state == IDLE and s.status is not None and _reached(m, s, k):
                    out.waiting[m.id] = (f"waits at rung {k + 1} (step {m.rungs[k]}) for {len(pending)} run(s) "
                                         f"of {group[0]}/{group[1]}")
            return
        scores: dict[str, float] = {}
        dropped = []
        for p in survivors:
            reached = [m for m in points[p] if _reached(m, seen[m.id], k)]
            if not reached:
                dropped.append(p)
                continue
            vals = [_order(value(m, m.rungs[k])) for m in reached]
            scores[p] = sum(vals) / len(vals) if all(math.isfinite(v) for v in vals) else math.inf
        ranking = select(scores, keep) if scores else []
        out.decisions.append(Decision(group, k + 1, tuple(sorted({m.rungs[k] for m in runs})), tuple(ranking),
                                      tuple(dropped)))
        kept_n = sum(r.kept for r in ranking)
        for rank, r in enumerate(ranking, 1):
            if r.kept:
                continue
            for m in points[r.point]:
                s = seen[m.id]
                if s.state == IDLE and s.status == "paused":
                    why = (f"rung {k + 1} of {n_rungs} (step {m.rungs[k]}): {metric} {r.value:.4g}, rank {rank} of "
                           f"{len(ranking)} live point(s) of {group[0]}/{group[1]}, {kept_n} kept")
                    out.prune[m.id] = {"rung": k + 1, "rungs": n_rungs, "step": m.rungs[k], "metric": metric,
                                       "value": r.value if math.isfinite(r.value) else None, "rank": rank,
                                       "of": len(ranking), "kept": kept_n, "point": r.point, "why": why}
        survivors = [r.point for r in ranking if r.kept]
        if not survivors:  # every point diverged or stalled: the group is finished
            return
    for p in survivors:
        for m in points[p]:
            if seen[m.id].state == IDLE:
                out.go[m.id] = None
