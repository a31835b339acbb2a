"""AdamW as every backend builds it: weight decay on matrices only, the learning rate set per step.

One builder, so the single-process, FSDP and DeepSpeed runs take the same parameter groups and hyperparameters
from `train.*`; a backend only chooses the class (DeepSpeed's discardable AdamW) and whether the fused kernel
runs.
"""

from __future__ import annotations

import torch
from torch import nn

from rrtrain.config import TrainConfig
from rrtrain.residuals import Site, Stream


def full_shape(p: nn.Parameter) -> torch.Size:
    """The parameter's shape; a ZeRO-3 parameter built under `zero.Init` holds an empty partition in `.data`
    and keeps its shape in `ds_shape`."""
    return getattr(p, "ds_shape", p.shape)


def no_decay_names(model: nn.Module) -> set[str]:
    """Names of parameters that must not be weight-decayed: every < 2-D parameter (norm gains, biases,
    scalars) plus whatever residual sites and streams list in `no_decay` (e.g. HC's static coefficients)."""
    names = {n for n, p in model.named_parameters() if len(full_shape(p)) < 2}
    for mod_name, mod in model.named_modules():
        if isinstance(mod, (Site, Stream)):
            for p_name in mod.no_decay:
                names.add(f"{mod_name}.{p_name}" if mod_name else p_name)
    return names


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    skip = no_decay_names(model)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, t: TrainConfig, fused: bool,
                    cls: type[torch.optim.AdamW] = torch.optim.AdamW) -> torch.optim.AdamW:
    """`cls` (torch's AdamW or a subclass) over `model`'s parameter groups; `fused=False` leaves the kernel
    choice to torch."""
    return cls(param_groups(model, t.weight_decay), lr=t.lr, betas=(t.beta1, t.beta2), eps=t.adam_eps,
               fused=fused or None)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
