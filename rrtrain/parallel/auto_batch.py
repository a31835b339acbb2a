"""`train.micro_batch: auto`: the largest micro-batch the planner fits in the GPU's free memory, with a margin.

Resolved once, where the trainer and `rrtrain bench` resolve the run (after the dataset's vocabulary and sequence
length are known, before the model is built), into an int: every other module sees an int, and the run directory's
config.yaml records the int chosen, as it records `train.compile: auto`'s decision. One line says the choice.

The rule: of the divisors m of global_batch / world size (so the accumulation count is whole, as the config
requires), the largest whose planned peak per rank (`rrtrain.parallel.memory`: the run's state, gathered buffers and
activations at micro-batch m, as `rrtrain plan` prints it) is at most (1 - MARGIN) of the free memory CUDA reports
on the device (`torch.cuda.mem_get_info`, the smallest over ranks, so every rank picks the same). The margin
covers the allocator's fragmentation and what the planner does not model (torch.compile's workspaces, cuBLAS and
NCCL buffers, float8's casts); the planner's own agreement with a measured peak is in docs/performance.md.

On a CPU there is no free-memory figure to size against: `auto` is refused in one line (exit 2) before anything is
written; set an integer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from rrtrain.config import Config
from rrtrain.core.errors import UsageError

#: share of the free device memory left unplanned (see the module's docstring)
MARGIN = 0.15


def require_device(cfg: Config, device: torch.device) -> None:
    """Refuse `auto` where it cannot be resolved (no CUDA device), before the run writes anything."""
    if cfg.train.micro_batch == "auto" and device.type != "cuda":
        raise UsageError("train.micro_batch=auto needs a CUDA device (it sizes the micro-batch from the GPU's free "
                         f"memory; this process runs on {device.type}); set an integer")


def divisors(n: int) -> list[int]:
    """The divisors of n, largest first."""
    return sorted({d for i in range(1, int(n**0.5) + 1) if n % i == 0 for d in (i, n // i)}, reverse=True)


def pick_micro_batch(per_rank: int, peak: Callable[[int], int], free_bytes: int,
                     margin: float = MARGIN) -> Optional[int]:
    """The largest divisor m of `per_rank` with peak(m) <= (1 - margin) x free_bytes; None when none fits.
    `peak(m)`: planned bytes per rank at micro-batch m (non-decreasing in m)."""
    budget = (1.0 - margin) * free_bytes
    for m in divisors(per_rank):
        if peak(m) <= budget:
            return m
    return None


@dataclass(frozen=True)
class Choice:
    """What `auto` chose, and why: for the printed line and `rrtrain bench`'s record."""

    micro_batch: int
    planned_bytes: int  # the planner's peak per rank at that micro-batch
    free_bytes: int  # the device's free memory before the model was built (smallest over ranks)
    margin: float = MARGIN

    def line(self) -> str:
        gib = 2**30
        return (f"rrtrain: train.micro_batch=auto: {self.micro_batch} (planned peak {self.planned_bytes / gib:.1f} GiB "
                f"per GPU of {self.free_bytes / gib:.1f} GiB free, {self.margin:.0%} kept as margin)")


def planned_peak(run, world_size: int) -> Callable[[int], int]:
    """The planner's peak per rank at micro-batch m for the resolved run `run` (rrtrain.resolve.ResolvedRun)."""
    import rrtrain.parallel.memory as planner

    def peak(m: int) -> int:
        setup = planner.Setup.of_run(run, world_size, micro_batch=m)
        return planner.plan(setup).total()  # the GPU named in Setup only sets capacity, unused here

    return peak


def free_memory(device: torch.device) -> int:
    """Free bytes on `device`, the smallest over the ranks when a process group runs."""
    free, _ = torch.cuda.mem_get_info(device)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        t = torch.tensor([free], dtype=torch.int64, device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN)
        free = int(t.item())
    return int(free)


def resolve_micro_batch(run, world_size: int, device: torch.device, announce: bool = True,
                        free_bytes: Optional[int] = None) -> tuple[Config, Optional[Choice]]:
    """`run.cfg` with `train.micro_batch` an int: unchanged when it is one, else `auto`'s choice (printed when
    `announce`). `free_bytes` stands in for the device's figure (tests). Raises UsageError when even 1 does not fit."""
    cfg: Config = run.cfg
    t = cfg.train
    if t.micro_batch != "auto":
        return cfg, None
    if free_bytes is None:
        require_device(cfg, device)
        free_bytes = free_memory(device)
    if t.global_batch % world_size:
        raise UsageError(f"train.global_batch={t.global_batch} is not a multiple of the world size ({world_size}), "
                         "so no micro-batch divides it (train.micro_batch=auto)")
    peak = planned_peak(run, world_size)
    m = pick_micro_batch(t.global_batch // world_size, peak, free_bytes)
    if m is None:
        raise UsageError(f"train.micro_batch=auto: not even one sequence per GPU fits: the plan needs "
                         f"{peak(1) / 2**30:.1f} GiB of {free_bytes / 2**30:.1f} GiB free less {MARGIN:.0%}; "
                         "use activation checkpointing (parallel.ac), more GPUs or a larger GPU")
    choice = Choice(micro_batch=m, planned_bytes=peak(m), free_bytes=free_bytes)
    if announce:
        print(choice.line(), flush=True)
    return dataclasses.replace(cfg, train=dataclasses.replace(t, micro_batch=m)), choice
