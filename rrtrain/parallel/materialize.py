"""Materialise a model built on the meta device: this rank's shards on its device, initialised in place.

Training builds the model on meta, applies activation checkpointing, compile and sharding from outside, and
only then allocates memory (`to_empty`: each DTensor parameter gets its local shard only). Initialisation
runs one unit at a time (`Transformer.init_unit`: the ends, then each block): the unit's full tensors are
drawn on the CPU from the unit's own generator (`rrtrain.model.transformer.unit_generator(seed, unit)`), and each rank
keeps its slice. A rank's set-up peak is its own shards plus one unit, and the weights are the same bits for
any world size, mesh or backend: DTensor's own random ops would draw per shard, which depends on the layout.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch
from torch import nn

from rrtrain.model.transformer import Transformer, unit_generator


def local_slice(full: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The part of `full` that `target` holds on this rank: all of it for a plain tensor; for a DTensor, the
    chunk its placements give this rank (torch.chunk per Shard dim, as DTensor and FSDP2 split), over any
    mesh (FSDP's Shard(0), HSDP's Replicate x Shard(0)). The rank along each mesh dim comes from that dim's
    process group, as FSDP2 takes it (a DeviceMesh reused from a cache can report a stale coordinate)."""
    if not hasattr(target, "device_mesh"):
        return full
    mesh, out = target.device_mesh, full
    for dim, placement in enumerate(target.placements):
        if placement.is_shard():
            axis = placement.dim
            chunks = torch.chunk(out, mesh.size(dim), dim=axis)
            k = mesh.get_local_rank(dim)
            out = chunks[k] if k < len(chunks) else out.narrow(axis, 0, 0)
        elif not placement.is_replicate():
            raise RuntimeError(f"cannot materialise a parameter placed as {placement}")
    return out


def copy_full(target: torch.Tensor, full: torch.Tensor) -> None:
    """Write `full` (the whole tensor, on the CPU) into `target`, which may be a shard of it."""
    local = target.to_local() if hasattr(target, "to_local") else target
    part = local_slice(full, target)
    if part.shape != local.shape:
        raise RuntimeError(f"local shard {tuple(local.shape)} does not match its slice {tuple(part.shape)}")
    with torch.no_grad():
        local.copy_(part)


def unit_tensors(module: nn.Module, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    for name, t in module.named_parameters():
        yield prefix + name, t
    for name, t in module.named_buffers():
        yield prefix + name, t


def initialise_units(model: Transformer, seed: int,
                     write: Callable[[list[tuple[torch.Tensor, torch.Tensor]]], None]) -> None:
    """For each unit of `model` in turn: draw its full tensors on the CPU from the unit's generator and hand
    `write` the (model tensor, full value) pairs; only one unit's full tensors exist at a time. Every
    parameter and buffer of the model must be written."""
    targets = dict(unit_tensors(model, ""))
    written: set[str] = set()
    for u in range(model.n_units):
        template = model.unit_template(u)
        model.init_unit(u, template, unit_generator(seed, u))
        values = list(unit_tensors(template, model.unit_prefix(u)))
        write([(targets[name], full) for name, full in values])
        written.update(name for name, _ in values)
        del template, values
    missing = sorted(set(targets) - written)
    if missing:
        raise RuntimeError(f"{len(missing)} tensors were left uninitialised, e.g. {missing[0]}")


def materialize(model: Transformer, device: torch.device, seed: int) -> None:
    """Allocate `model`'s local tensors on `device` (meta -> empty) and initialise them unit by unit: the same
    bits as `Transformer.init_weights(seed)` on a whole model. Call after sharding, before the optimizer."""
    model.to_empty(device=device)
    initialise_units(model, seed, copy_all)


def copy_all(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for target, full in pairs:
        copy_full(target, full)


def is_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


def place(model: Transformer, device: torch.device, seed: int) -> None:
    """A meta-built model (training's path): this rank's tensors on `device`, initialised from `seed`.
    A model built with its weights (a caller that initialised it itself): moved to `device`."""
    if is_meta(model):
        materialize(model, device, seed)
    else:
        model.to(device)
