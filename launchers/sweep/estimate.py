"""What a run costs before it is submitted: its parameters and training FLOPs (the run as `launchers.sweep.expand` resolved
it, matched as the trainer will match it) and GPU-hours at an assumed MFU on a named GPU's peak."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from launchers.sweep.expand import Run
from rrtrain.core.errors import UsageError
from rrtrain.core.hardware import GPU_PEAK_TFLOPS, precision_key


@dataclass(frozen=True)
class Cost:
    params: int
    tokens: int
    flops: float
    gpu_hours: Optional[float]  # None for CPU runs


def check_gpu(name: str) -> None:
    if name.upper() not in GPU_PEAK_TFLOPS:  # named case-insensitively, as `rrtrain plan --gpu` takes it
        raise UsageError(f"gpu: unknown GPU '{name}'; known: {', '.join(GPU_PEAK_TFLOPS)}")


def cost(run: Run, gpu: str, mfu: float) -> Cost:
    """The cost of a run from `expand` (which resolved it; a run read back from a record has no estimate)."""
    if run.resolved is None:
        raise ValueError(f"run {run.id} was not resolved: cost() takes the runs of launchers.sweep.expand.expand")
    r = run.resolved
    tokens = r.tokens or 0
    flops = r.flops_per_token * tokens
    hours = None
    if run.resources.gpus_per_node:
        peak = GPU_PEAK_TFLOPS[gpu.upper()][precision_key(r.cfg.parallel.precision)] * 1e12
        hours = flops / (peak * mfu) / 3600.0
    return Cost(r.params, tokens, flops, hours)


@dataclass(frozen=True)
class GroupCost:
    """The cost of one (size, variant) of a sweep with a grid: how many points and runs, and their GPU-hours."""

    size: str
    variant: str
    points: int
    runs: int
    gpu_hours: Optional[float]


def grid_costs(runs: list[Run], gpu: str, mfu: float) -> list[GroupCost]:
    """Per (size, variant), in the runs' order: the grid's points, runs and GPU-hours (None for CPU runs);
    empty when no run has a grid point."""
    if not any(r.point for r in runs):
        return []
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.size, r.variant), []).append(r)
    out = []
    for (size, variant), members in groups.items():
        hours = [cost(r, gpu, mfu).gpu_hours for r in members]
        total = None if any(h is None for h in hours) else sum(h for h in hours if h is not None)
        npoints = len({tuple(sorted(r.point.items())) for r in members})
        out.append(GroupCost(size, variant, npoints, len(members), total))
    return out
