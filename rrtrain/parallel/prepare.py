"""What every backend does to the blocks before it wraps them: float8 conversion, activation checkpointing, then
torch.compile.

The order matters and is the same on every backend (torchtitan's): the float8 layers first (`parallel.float8`,
rrtrain/parallel/float8.py), so checkpointing and compile see the converted blocks; checkpointing before compile,
so each compiled block's graph includes the recomputation boundary; all before sharding or
`deepspeed.initialize`, which wrap the blocks as they find them. All keep parameter names unchanged, so
checkpoints move between settings.
"""

from __future__ import annotations

from rrtrain.config import Config
from rrtrain.model.transformer import Transformer
from rrtrain.parallel.float8 import convert as convert_float8
from rrtrain.parallel.ac import apply_ac


def prepare_blocks(model: Transformer, cfg: Config, fsdp: bool = False) -> None:
    """Convert the large linear layers to float8 when `parallel.float8` asks (`fsdp`: the model will be sharded
    by FSDP2), checkpoint the blocks `parallel.ac` selects, then compile every block when `train.compile` is true
    (the trainer and bench resolve "auto" to a bool first: rrtrain/parallel/compile_policy.py)."""
    if not isinstance(cfg.train.compile, bool):  # "auto" is truthy: compiling on it would ignore the policy
        raise ValueError(f"train.compile={cfg.train.compile!r} must be made definite first "
                         "(rrtrain.parallel.compile_policy.resolve_compile)")
    convert_float8(model, cfg.parallel.float8, fsdp)
    apply_ac(model.blocks, cfg.parallel.ac, cfg.parallel.ac_every)
    if cfg.train.compile:
        for block in model.blocks:
            block.compile()
