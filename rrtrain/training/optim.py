"""The warmup-then-cosine learning-rate schedule with plain arguments (rrtrain/planning/depth_study.py uses it).
The trainer steps on `rrtrain.schedule.lr_at` (every `train.schedule`), whose cosine is this one bit for bit. The
optimizer itself (AdamW, weight decay on matrices only) is built by the parallel backends: rrtrain/parallel/adamw.py."""

from __future__ import annotations

import math


def lr_at(step: int, total: int, lr: float, warmup: int, min_ratio: float) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup, then cosine down to min_ratio * lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if total <= warmup:
        return lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
