"""Activation checkpointing of transformer blocks: none, full (every block) or selective (every k-th).

Uses the composable `checkpoint` API, which keeps parameter names unchanged, so checkpoints written with
one AC setting load with another and FSDP2 composes with it.
"""

from __future__ import annotations

from torch import nn
from torch.distributed._composable import checkpoint


def apply_ac(blocks: nn.ModuleList, mode: str, every: int) -> int:
    """Checkpoint the selected blocks in place; returns how many were wrapped."""
    if mode == "none":
        return 0
    chosen = [b for i, b in enumerate(blocks) if mode == "full" or i % every == 0]
    for block in chosen:
        checkpoint(block)
    return len(chosen)
