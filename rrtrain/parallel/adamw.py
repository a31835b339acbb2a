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
from rrtrain.model.parametrization import ROLES, Parametrization, role_of
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


def parametrization_of(model: nn.Module) -> Parametrization | None:
    """The model's `model.parametrization` (its spec's); None for a model without one (a test's module)."""
    spec = getattr(model, "spec", None)
    return getattr(spec, "parametrization", None)


def param_groups(model: nn.Module, weight_decay: float, adam_eps: float = 1e-8) -> list[dict]:
    """Under sp (or a model without a parametrization): two groups, weight decay on and off, as always. Under
    mup/completep: one group per (role, decay) with its own `lr_scale` (the step's learning rate is multiplied by
    it, `set_lr`), `eps` and `weight_decay` (rrtrain/model/parametrization.py); `adam_eps` is train.adam_eps."""
    p = parametrization_of(model)
    if p is not None and not p.is_sp:
        return parametrized_groups(model, p, weight_decay, adam_eps)
    skip = no_decay_names(model)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def parametrized_groups(model: nn.Module, p: Parametrization, weight_decay: float, adam_eps: float) -> list[dict]:
    """The mup/completep groups: each parameter's role (`role_of`: the model's embeddings and matrices; a rule's
    parameters by its declared composition), split by whether it decays at all (`no_decay_names`)."""
    skip = no_decay_names(model)
    comp = model.rule.composition
    local: dict[str, tuple[str, bool]] = {}  # full name -> (name inside its Site/Stream, in the stream)
    for mod_name, mod in model.named_modules():
        if isinstance(mod, (Site, Stream)):
            for p_name, _ in mod.named_parameters():
                local[f"{mod_name}.{p_name}" if mod_name else p_name] = (p_name, isinstance(mod, Stream))
    try:
        roles = {}
        for name, param in model.named_parameters():
            if param.requires_grad:
                where = local.get(name)
                roles[name] = role_of(name, where[0] if where else None, bool(where and where[1]), comp)
    except ValueError as err:
        raise UsageError(f"model.parametrization={p.name}, residual rule '{model.rule.name}': {err}") from None
    shape = model.spec.shape
    lr, eps, wd = p.lr_scales(shape), p.eps_scales(shape), p.wd_scales(shape)
    params = dict(model.named_parameters())
    groups = []
    for role in ROLES:
        for decays in (True, False):
            members = [params[n] for n, r in roles.items() if r == role and (n not in skip) == decays]
            if members:
                groups.append({"params": members, "weight_decay": weight_decay * wd[role] if decays else 0.0,
                               "lr_scale": lr[role], "eps": adam_eps * eps[role], "role": role})
    return groups


def describe_groups(model: nn.Module, weight_decay: float, adam_eps: float) -> list[dict]:
    """Each group `param_groups` makes as plain data (its settings, and how many tensors and parameters it
    holds): what a run records (parametrization.json) and `rrtrain params` shows."""
    out = []
    for g in param_groups(model, weight_decay, adam_eps):
        row = {k: v for k, v in g.items() if k != "params"}
        row.setdefault("role", "decay" if g["weight_decay"] else "no_decay")
        row.setdefault("lr_scale", 1.0)
        row.setdefault("eps", adam_eps)
        row.update(tensors=len(g["params"]), params=sum(int(torch.Size(full_shape(q)).numel()) for q in g["params"]))
        out.append(row)
    return out


def parametrization_record(model: nn.Module, t: TrainConfig) -> dict | None:
    """What a mup/completep run records (parametrization.json): the multipliers at its shape and its optimizer's
    groups; None under sp (nothing new to record: the two groups it always had)."""
    p = parametrization_of(model)
    if p is None or p.is_sp:
        return None
    record = {**p.multipliers(model.spec.shape), "rule": model.rule.name,
              "composition": model.rule.composition.table_row(),
              "groups": describe_groups(model, t.weight_decay, t.adam_eps)}
    if not model.rule.composition.applies_branch(model.knobs):
        record["branch_multiplier"] = None  # switched off by the rule's knob: nothing multiplied
    return record


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
    return cls(param_groups(model, t.weight_decay, t.adam_eps), lr=t.lr, betas=(t.beta1, t.beta2), eps=t.adam_eps,
               fused=fused or None)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The step's learning rate on every group; a mup/completep group's times its `lr_scale`."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"] if "lr_scale" in group else lr
