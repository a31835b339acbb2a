"""Successive halving on a sweep directory: the rung steps of each run, what its files say, the values at the
rungs, and the plan of `launchers.prune.rule` carried out (pause requests written, pruned runs marked), with what
pruning saved. `rrtrain sweep` calls it once per pass (the local and debug executors pass until no run can go
on; Slurm once per `rrtrain sweep`, which is run again to take the next rung).

`SWEEP_DIR/prune.json` keeps the values read at the rungs, the decisions of the last pass and what pruning
saved, which `rrtrain status` prints. The values there are a record, never read back: anyone who can write the
sweep directory could put other numbers there, so every pass ranks by each run's own metrics.jsonl (through
the bounded reader, `rrtrain.rundir.readers.records`).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Optional

from launchers.prune import rule as prune
from launchers.state.pruning import STATE, load_state, saved_line  # noqa: F401 (saved_line: the summary line)
from launchers.sweep.expand import Run
from launchers.sweep.spec import PruneSpec
from rrtrain.config import is_setting
from rrtrain.config_load import dotted_keys
from rrtrain.core.errors import UsageError
from rrtrain.core.io import atomic_write_json
from rrtrain.rundir import fields, readers, writers
from rrtrain.rundir.outcome import PAUSED, PRUNED, pruned

#: what each metric reads from metrics.jsonl
METRIC_KEY = {"val_loss": "val_loss", "train_loss": "loss"}


def smooth(p: PruneSpec) -> int:
    """Values averaged up to a rung: as set, else 1 evaluation or 10 training steps."""
    return p.smooth if p.smooth is not None else (1 if p.metric == "val_loss" else 10)


def total_steps(run: Run) -> int:
    if run.resolved is not None and run.resolved.budget is not None:
        return run.resolved.budget.total_steps
    from launchers.state.runstate import total_steps as from_config

    steps = from_config(run.config)
    if steps is None:
        raise UsageError(f"run {run.id}: no step budget to place the rungs of prune on")
    return steps


def rung_steps(p: PruneSpec, run: Run) -> tuple[int, ...]:
    """The steps of a run's rungs: a fraction of its steps (or a step count), rounded down to a multiple of
    `train.stop_check_every` (where a run can pause with every record delivered); refused when two fall on one
    step, when one is not before the end, or when a validation metric has no evaluation by the first."""
    total = total_steps(run)
    t = run.config["train"]
    every, evals = int(t["stop_check_every"]), int(t["eval_every"])
    steps = []
    for r in p.rungs:
        raw = int(r * total) if isinstance(r, float) else int(r)
        step = raw // every * every
        if step < every or step >= total:
            raise UsageError(f"prune.rungs: rung {r} of run {run.id} falls on step {step}, outside [{every}, {total}) "
                             f"(its {total} steps, rounded down to a multiple of train.stop_check_every={every})")
        if steps and step <= steps[-1]:
            raise UsageError(f"prune.rungs: rungs {p.rungs} fall on steps {steps + [step]} for run {run.id} (rounded "
                             f"down to multiples of train.stop_check_every={every}): space them further apart")
        steps.append(step)
    if p.metric == "val_loss" and not 0 < evals <= steps[0]:
        raise UsageError(f"prune.metric val_loss: run {run.id} evaluates first at step "
                         f"{evals if evals else total} (train.eval_every={evals}), after its first rung at step "
                         f"{steps[0]}: lower train.eval_every or use prune.metric: train_loss")
    return tuple(steps)


def members(p: PruneSpec, runs: list[Run]) -> list[prune.Member]:
    """The runs as the ladder sees them: grouped by (size, variant), each point labelled by the training keys
    whose values differ within its group (the seed, name and directory aside)."""
    settings = {r.id: {k: v for k, v in dotted_keys(r.config).items()
                       if is_setting(k)} for r in runs}
    by_group: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        by_group.setdefault((r.size, r.variant), []).append(r)
    out = []
    for group, rs in by_group.items():
        keys = sorted({k for r in rs for k in settings[r.id]})
        varying = [k for k in keys if len({json.dumps(settings[r.id].get(k), sort_keys=True) for r in rs}) > 1]
        for r in rs:
            label = ",".join(f"{k}={settings[r.id].get(k)}" for k in varying) or "(one setting)"
            out.append(prune.Member(r.id, group, label, rung_steps(p, r), total_steps(r)))
    return out


def rung_lines(p: PruneSpec, runs: list[Run]) -> list[str]:
    """For --dry-run: where the rungs fall (refuses rungs that cannot be placed, like the sweep itself)."""
    by_steps: dict[tuple, list[str]] = {}
    for m in members(p, runs):
        by_steps.setdefault((m.rungs, m.total), []).append(m.id)
    lines = [f"prune: keep {p.keep:g} of each (size, variant)'s points at each rung, by {p.metric} "
             f"(mean of the last {smooth(p)})"]
    for (rungs, total), ids in by_steps.items():
        lines.append(f"prune: rungs at steps {', '.join(map(str, rungs))} of {total} for {len(ids)} run(s)")
    return lines


def observe(runs: list[Run], skipped: dict[str, str]) -> dict[str, prune.Seen]:
    """What each run's files and the scheduler say (`skipped`: the state of each run `rrtrain sweep` leaves
    alone; every other run is idle: it trains only when submitted)."""
    out = {}
    for r in runs:
        final = readers.read_final(r.dir)
        step = final.step if final is not None and final.step is not None else 0
        state = skipped.get(r.id)
        if state == "completed":
            out[r.id] = prune.Seen(prune.COMPLETED, step, state)
        elif state in ("diverged", "stalled"):
            out[r.id] = prune.Seen(prune.DEAD, step, state)
        elif state is not None:  # running, or queued
            out[r.id] = prune.Seen(prune.ACTIVE, step, final.status if final else None)
        else:
            out[r.id] = prune.Seen(prune.IDLE, step, final.status if final else None)
    return out


class Values:
    """A run's metric at a rung (the mean of its last `smooth` values at or before the rung's step; inf when it
    has none or one is not finite), read from metrics.jsonl once per pass into `cache` (saved in prune.json as a
    record of the pass)."""

    def __init__(self, p: PruneSpec, dirs: dict[str, Path], cache: dict[str, Any]) -> None:
        self.key, self.n, self.dirs = METRIC_KEY[p.metric], smooth(p), dirs
        self.cache = cache

    def __call__(self, m: prune.Member, step: int) -> float:
        name = f"{m.id}|{self.key}|{self.n}|{step}"
        if name not in self.cache:
            self.cache[name] = self.read(self.dirs[m.id], step)
        v = fields.number(self.cache[name])
        return v if v is not None and math.isfinite(v) else math.inf

    def read(self, run_dir: Path, step: int) -> Optional[float]:
        by_step: dict[int, Any] = {}
        for rec in readers.records(readers.metrics_path(run_dir)):
            if rec is None or self.key not in rec or (self.key == "loss" and rec.get("kind") not in (None, "train")):
                continue
            s = fields.step(rec.get("step"))
            if s is not None and s <= step:
                by_step[s] = rec[self.key]
        last = [by_step[s] for s in sorted(by_step)[-self.n:]]
        if not last or not all(fields.is_number(v) and math.isfinite(v) for v in last):
            return None
        return sum(last) / len(last)


def carry_out(out: Path, p: PruneSpec, runs: list[Run], skipped: dict[str, str],
              exclude: frozenset[str] = frozenset()) -> prune.Plan:
    """One pass: plan, mark the pruned runs (their final.json), write the pause requests of the runs that go on
    (a run in `exclude`, one that failed in this `rrtrain sweep`, is not sent again), save prune.json."""
    by_id = {r.id: r for r in runs}
    state = load_state(out)
    cache: dict[str, Any] = {}  # prune.json's values are never read back: the runs' own metrics rank them
    values = Values(p, {r.id: r.dir for r in runs}, cache)
    ms = members(p, runs)
    result = prune.plan(ms, observe(runs, skipped), values, p.keep, p.metric)
    for rid, rung in result.prune.items():
        final = readers.read_final(by_id[rid].dir)
        if final is not None and final.status == PAUSED:
            writers.write_final(by_id[rid].dir, pruned(final.raw, {**rung, "time": time.time()}))
    result.go = {rid: step for rid, step in result.go.items() if rid not in exclude}
    rungs_of = {m.id: m.rungs for m in ms}
    for rid, step in result.go.items():
        if step is None:
            writers.clear_pause(by_id[rid].dir)
        else:
            k = rungs_of[rid].index(step) + 1
            writers.write_pause(by_id[rid].dir, step, f"rung {k} of {len(rungs_of[rid])} of the sweep's pruning")
    state.update({"values": cache, "time": time.time(), "spec": {"rungs": list(p.rungs), "keep": p.keep,
                                                                   "metric": p.metric, "smooth": smooth(p)},
                  "decisions": [decision_json(d) for d in result.decisions]})
    atomic_write_json(Path(out) / STATE, state)
    return result


def clear_pauses(runs: list[Run]) -> None:
    """A sweep without `prune`: the runs it submits train to their end, whatever an earlier pass asked."""
    for r in runs:
        writers.clear_pause(r.dir)


def decision_json(d: prune.Decision) -> dict[str, Any]:
    return {"size": d.group[0], "variant": d.group[1], "rung": d.rung, "steps": list(d.steps),
            "ranking": [{"point": r.point, "value": r.value if math.isfinite(r.value) else None, "kept": r.kept}
                        for r in d.ranking], "dropped": list(d.dropped)}


def savings(out: Path, runs: list[Run], cost: Callable[[Run], Any]) -> dict[str, Any]:
    """What pruning saved against running every point to its end, by `--dry-run`'s estimate (`cost`): the part
    of each pruned run's GPU-hours (and FLOPs) after the step it was pruned at. Saved in prune.json."""
    saved_h = all_h = saved_f = all_f = 0.0
    n = 0
    gpu = False
    for r in runs:
        c = cost(r)
        all_f += c.flops
        all_h += c.gpu_hours or 0.0
        gpu = gpu or c.gpu_hours is not None
        final = readers.read_final(r.dir)
        if final is None or final.status != PRUNED or final.step is None:
            continue
        left = max(0.0, 1.0 - final.step / total_steps(r))
        n += 1
        saved_f += c.flops * left
        saved_h += (c.gpu_hours or 0.0) * left
    result = {"pruned_runs": n, "saved_gpu_hours": saved_h if gpu else None,
              "all_gpu_hours": all_h if gpu else None, "saved_flops": saved_f, "all_flops": all_f}
    state = load_state(out)
    state["saved"] = result
    atomic_write_json(Path(out) / STATE, state)
    return result


def describe(result: prune.Plan) -> list[str]:
    """The pass's decisions and waits, one line each."""
    lines = []
    for d in result.decisions:
        steps = "/".join(map(str, d.steps))
        ranks = ", ".join(f"{r.point} {r.value:.4g}{'' if r.kept else ' (pruned)'}" for r in d.ranking)
        dropped = f"; out (diverged or stalled): {', '.join(d.dropped)}" if d.dropped else ""
        lines.append(f"prune {d.group[0]}/{d.group[1]} rung {d.rung} (step {steps}): {ranks or 'no live point'}"
                     f"{dropped}")
    for rid, why in sorted(result.waiting.items()):
        lines.append(f"{rid}: paused, {why}")
    return lines
