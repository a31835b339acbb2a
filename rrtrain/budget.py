"""A run's budget: tokens per step, total and warm-up steps, from its `train` section and sequence length.

The one place these are computed: the resolved run (`rrtrain.resolve`) holds them for the trainer, the planner
and the sweep's estimates, and `rrtrain status` computes a row's total steps here. It stands on the config
alone (no torch: status reads hundreds of runs in under two seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rrtrain.config import TrainConfig
from rrtrain.core.errors import UsageError

NO_BUDGET = "set train.max_steps or train.tokens (the run's budget)"


def total_steps(max_steps: Optional[int], tokens: Optional[int], tokens_per_step: int) -> Optional[int]:
    """Optimizer steps: `max_steps` wins over the token budget; None when neither is set."""
    if max_steps is not None:
        return int(max_steps)
    if tokens is None:
        return None
    return max(1, int(tokens) // int(tokens_per_step))


def warmup_steps(warmup: Optional[int], total: int) -> int:
    """The learning-rate warm-up: as set, else 5% of the steps (at least 1)."""
    return warmup if warmup is not None else max(1, total // 20)


@dataclass(frozen=True)
class Budget:
    tokens_per_step: int  # global_batch x seq_len
    total_steps: int
    warmup_steps: int
    tokens: int  # the budget as asked: max_steps x tokens_per_step, else train.tokens


def budget(t: TrainConfig, seq_len: int) -> Optional[Budget]:
    """The run's budget at sequence length `seq_len`, or None when the config sets none (bench and plan need none)."""
    per_step = t.global_batch * seq_len
    total = total_steps(t.max_steps, t.tokens, per_step)
    if total is None:
        return None
    tokens = total * per_step if t.max_steps is not None else int(t.tokens)
    return Budget(per_step, total, warmup_steps(t.warmup_steps, total), tokens)


def require(b: Optional[Budget]) -> Budget:
    """The budget of a run that trains: refuse one that sets none."""
    if b is None:
        raise UsageError(NO_BUDGET)
    return b
