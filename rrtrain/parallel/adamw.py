"""AdamW as every backend builds it: weight decay on matmul weights only, the learning rate set per step.

One builder, so the single-process, FSDP and DeepSpeed runs take the same parameter groups and hyperparameters
from `train.*`; a backend only chooses the class (DeepSpeed's discardable AdamW) and whether the fused kernel
runs.
"""

from __future__ import annotations

import torch
from torch import nn

from rrtrain.config import TrainConfig
from rrtrain.core.errors import UsageError
from rrtrain.residuals import Site, Stream


def full_shape(p: nn.Parameter) -> torch.Size:
    """The parameter's shape; a ZeRO-3 parameter built under `zero.Init` holds an empty partition in `.data`
    and keeps its shape in `ds_shape`."""
    return getattr(p, "ds_shape", p.shape)


def no_decay_names(model: nn.Module) -> set[str]:
    """Names of parameters that must not be weight-decayed: every < 2-D parameter (norm gains, biases,
    scalars) plus whatever residual sites and streams declare in `no_decay` — every parameter of theirs that
    is not a matmul weight although it has two dimensions (GR's (n, d) norm gains, HC's static coefficients).

    A declared name that is not a parameter is a rule's bug that would decay the parameter it meant to spare:
    a one-line error (UsageError: the rule may be the user's own) rather than a run that is silently wrong."""
    params = dict(model.named_parameters())
    names = {n for n, p in params.items() if len(full_shape(p)) < 2}
    for mod_name, mod in model.named_modules():
        if isinstance(mod, (Site, Stream)):
            for p_name in mod.no_decay:
                full = f"{mod_name}.{p_name}" if mod_name else p_name
                if full not in params:
                    raise UsageError(f"{type(mod).__name__}.no_decay names '{p_name}', which is not one of its "
                                     f"parameters ({', '.join(n for n, _ in mod.named_parameters())})")
                names.add(full)
    return names


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    skip = no_decay_names(model)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def group_names(model: nn.Module, weight_decay: float) -> list[set[str]]:
    """The parameter names of each non-empty group `param_groups` makes (how a checkpoint's groups are compared)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [{names[id(p)] for p in g["params"]} for g in param_groups(model, weight_decay) if g["params"]]


def check_decay_groups(saved: list[set[str]], current: list[set[str]], checkpoint: str) -> None:
    """Refuse, in one line, a checkpoint whose optimizer holds parameters in other weight-decay groups than this
    build: one written before a rule declared a parameter in `no_decay` (GR's (n, d) norm gains were decayed
    until they were declared). torch and DeepSpeed would otherwise fail deep in the load or the first step."""
    saved, current = [g for g in saved if g], [g for g in current if g]
    was = {n: frozenset(g) for g in saved for n in g}
    moved = [n for g in sorted(current, key=len) for n in sorted(g) if n in was and was[n] != frozenset(g)]
    if moved:
        sizes = ["+".join(str(len(g)) for g in groups) for groups in (saved, current)]
        raise UsageError(f"checkpoint {checkpoint}: its optimizer groups the parameters for weight decay otherwise "
                         f"({sizes[0]} there, {sizes[1]} here; e.g. {moved[0]}): written by an older rrtrain "
                         f"(before GR's norm gains left weight decay, say); resume it with that one or start a new "
                         f"run.dir")


def build_optimizer(model: nn.Module, t: TrainConfig, fused: bool,
                    cls: type[torch.optim.AdamW] = torch.optim.AdamW) -> torch.optim.AdamW:
    """`cls` (torch's AdamW or a subclass) over `model`'s parameter groups; `fused=False` leaves the kernel
    choice to torch."""
    return cls(param_groups(model, t.weight_decay), lr=t.lr, betas=(t.beta1, t.beta2), eps=t.adam_eps,
               fused=fused or None)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
