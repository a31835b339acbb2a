"""What every backend does to the blocks before it wraps them: activation checkpointing, then torch.compile.

The order matters and is the same on every backend: checkpointing first, so each compiled block's graph
includes the recomputation boundary; both before sharding or `deepspeed.initialize`, which wrap the blocks as
they find them. Both keep parameter names unchanged, so checkpoints move between settings.
"""

from __future__ import annotations

from rrtrain.config import Config
from rrtrain.model.transformer import Transformer
from rrtrain.parallel.ac import apply_ac


def prepare_blocks(model: Transformer, cfg: Config) -> None:
    """Checkpoint the blocks `parallel.ac` selects, then compile every block when `train.compile` is true
    (the trainer and bench resolve "auto" to a bool first: rrtrain/parallel/compile_policy.py)."""
    apply_ac(model.blocks, cfg.parallel.ac, cfg.parallel.ac_every)
    if cfg.train.compile:
        for block in model.blocks:
            block.compile()
