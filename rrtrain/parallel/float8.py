"""`parallel.float8: rowwise | tensorwise`: float8 matmuls for the blocks' large linear layers, through torchao.

torchao's `convert_to_float8_training` swaps the chosen `nn.Linear`s for its `Float8Linear`, which casts input,
weight and output gradient to float8 (e4m3) with dynamic scales around each matmul and keeps the weights, their
gradients and the optimizer in the run's own precision (fp32 master weights, bf16 compute copies under FSDP2).
`Float8Linear` is an `nn.Linear` with the same parameters and no state of its own, so a float8 run's state dict
has the keys and values a bf16 run's has: its checkpoints load into a bf16 run and back.

Which layers: a linear layer of a block's attention or MLP whose two dimensions are multiples of 16 (the float8
matmul's requirement) and both at least `MIN_DIM`. The embeddings and the tied LM head are not linear layers of a
block, and the residual rules' own layers (the sites: `review`'s gate projection, ...) are left alone: a rule may
use its weights as tensors rather than call the layer (the review gate folds its norms' gains into the weight),
which torchao's float8 weights do not support; all of these stay in bf16. The casts are memory-bound passes over the operands, which a small matmul does not repay.
`MIN_DIM` is rrtrain's own choice and looser than torchao's auto filters (tuned on H100; rowwise skips a layer
with out <= 2048, or in <= 1024, or out <= 4096 and in <= 2048; tensorwise one with in <= 4096 and out <= 1024):
torchtitan by default converts every linear but the output layer. Every block linear has d_model as one of its
dimensions, so from rr-320m (d_model 1024) up all of them convert and at rr-60m and rr-150m none does;
tests/benchmarks/gpu.sh measures whether it pays at rr-1b.

Order, as torchtitan applies it: conversion first, on the meta-built model, then activation checkpointing and
torch.compile (rrtrain/parallel/prepare.py), then FSDP2. With `tensorwise` under FSDP2 the weights are
all-gathered in float8 (torchao's `enable_fsdp_float8_all_gather`, half the bytes of bf16) and the engine
computes every weight's scale in one pass after each optimizer step (`precompute_float8_dynamic_scale_for_fsdp`).
`rowwise` all-gathers in bf16 (torchao supports float8 all-gather for tensorwise scaling only).

Hardware: float8 matmuls need a CUDA GPU of compute capability 8.9 or more (Ada, Hopper, Blackwell). Elsewhere the
setting is refused in one line before anything is written (`require_hardware`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import nn

from rrtrain.core.errors import UsageError

RECIPES = ("rowwise", "tensorwise")
#: smallest in/out dimension of a linear layer that converts (see the module's docstring)
MIN_DIM = 1024
#: float8 matmuls (torch._scaled_mm) need at least this compute capability
MIN_CAPABILITY = (8, 9)


def hardware_problem(device: torch.device) -> Optional[str]:
    """Why this device cannot run float8 matmuls, or None when it can."""
    if device.type != "cuda":
        return f"no CUDA device ({device.type})"
    cap = torch.cuda.get_device_capability(device)
    if cap < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return f"{name} has compute capability {cap[0]}.{cap[1]}, below {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}"
    return None


def require_hardware(setting: str, device: torch.device) -> None:
    """Refuse `parallel.float8` on a device without float8 matmuls, or without torchao installed (UsageError)."""
    if setting == "off":
        return
    problem = hardware_problem(device)
    if problem is not None:
        raise UsageError(f"parallel.float8={setting} needs a GPU with float8 matmuls (compute capability 8.9 or "
                         f"more: H100, H200, L40S, B200): {problem}; set parallel.float8=off")
    _torchao(setting)


def _torchao(setting: str):
    try:
        import torchao.float8 as f8
    except ImportError as err:
        raise UsageError(f"parallel.float8={setting} needs torchao ({err}): pip install 'rrtrain[float8]'") from None
    return f8


def convertible(module: nn.Module, min_dim: int = MIN_DIM) -> bool:
    """Whether a layer's shape converts: an nn.Linear with both dimensions multiples of 16 and at least `min_dim`
    (`convert` also requires it to be a layer of a block's attention or MLP)."""
    if not isinstance(module, nn.Linear):
        return False
    out_f, in_f = module.weight.shape
    return out_f % 16 == 0 and in_f % 16 == 0 and min(out_f, in_f) >= min_dim


def linear_config(setting: str, fsdp: bool, emulate: bool = False):
    """torchao's recipe for `setting`; float8 all-gather under FSDP2 for tensorwise (the one it supports)."""
    f8 = _torchao(setting)
    config = f8.Float8LinearConfig.from_recipe_name(setting)
    changes = {}
    if setting == "tensorwise" and fsdp:
        changes["enable_fsdp_float8_all_gather"] = True
    if emulate:
        changes["emulate"] = True
    return dataclasses.replace(config, **changes) if changes else config


def convert(model: nn.Module, setting: str, fsdp: bool, *, device: Optional[torch.device] = None,
            min_dim: int = MIN_DIM, _check_hardware: bool = True) -> list[str]:
    """Swap the blocks' convertible linear layers for torchao's Float8Linear in place; returns their names.

    `device`: where the run computes (checked for float8 hardware). `_check_hardware=False` (tests only) skips
    the check and converts in torchao's emulation mode, which runs the casts on a CPU."""
    if setting == "off":
        return []
    if setting not in RECIPES:
        raise UsageError(f"parallel.float8: expected one of off, {', '.join(RECIPES)}, got {setting!r}")
    if _check_hardware:
        require_hardware(setting, device if device is not None else _current_device())
    f8 = _torchao(setting)
    config = linear_config(setting, fsdp, emulate=not _check_hardware)
    blocks = getattr(model, "blocks", None)
    if blocks is None:
        raise TypeError("float8 conversion expects a model with `blocks`")
    chosen: list[str] = []

    def keep(module: nn.Module, fqn: str) -> bool:  # fqn: "<block>.<sublayer>.<layer>"
        if fqn.split(".")[1:2] in (["attn"], ["mlp"]) and convertible(module, min_dim):
            chosen.append(fqn)
            return True
        return False

    f8.convert_to_float8_training(blocks, config=config, module_filter_fn=keep)
    for block in blocks:  # the swapped layers lost the hooks a rule put on the old ones
        block.attach_sites()
    return [f"blocks.{name}" for name in chosen]


def needs_scale_precompute(model: nn.Module) -> bool:
    """Whether any converted layer all-gathers its weight in float8 (then scales are computed after each step)."""
    return any(getattr(getattr(m, "config", None), "enable_fsdp_float8_all_gather", False)
               for m in model.modules() if type(m).__name__ == "Float8Linear")


def precompute_scales(model: nn.Module) -> None:
    """torchao's one-pass scale computation for float8 all-gather: after the optimizer step, before the next
    forward (torchtitan does the same)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def _current_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
