"""The data-parallel device mesh FSDP2 shards over: 1-D (FSDP) or 2-D (HSDP).

`parallel.dp_shard` ranks share one copy of the model, each holding 1/dp_shard of every parameter, gradient and
optimizer state; `parallel.dp_replicate` such groups hold identical copies and all-reduce their gradients. A
multi-node job shards within a node (fast links) and replicates across nodes. The product must be the world size,
which only the launcher knows, so it is checked here rather than in rrtrain/config.py.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from rrtrain.config import ParallelConfig
from rrtrain.core.errors import UsageError

REPLICATE, SHARD = "dp_replicate", "dp_shard"


def mesh_shape(p: ParallelConfig, world: int) -> tuple[int, int]:
    """(replicate, shard) for `world` ranks. Unset keys default to sharding over every rank; one key set alone
    takes the other as world / it (rounded down: the product check names the bad key)."""
    if p.dp_replicate is not None:
        replicate = p.dp_replicate
    else:
        replicate = world // p.dp_shard if p.dp_shard is not None else 1
    shard = p.dp_shard if p.dp_shard is not None else world // replicate
    if shard * replicate != world:
        raise UsageError(f"parallel.dp_shard ({p.dp_shard}) x parallel.dp_replicate ({p.dp_replicate}) must equal "
                         f"the world size ({world})")
    return replicate, shard


def build_mesh(p: ParallelConfig, world: int, device: torch.device) -> DeviceMesh:
    """A 1-D mesh ("dp_shard") without replication, so plain FSDP runs exactly as before HSDP existed; else the
    2-D ("dp_replicate", "dp_shard") mesh, shard groups made of consecutive ranks (one node)."""
    replicate, shard = mesh_shape(p, world)
    if replicate == 1:
        return init_device_mesh(device.type, (shard,), mesh_dim_names=(SHARD,))
    return init_device_mesh(device.type, (replicate, shard), mesh_dim_names=(REPLICATE, SHARD))


def shard_group(mesh: DeviceMesh) -> torch.distributed.ProcessGroup:
    """This rank's shard group: summing a per-rank partial over it counts every element of a sharded tensor once
    (summed over all ranks, HSDP would count it dp_replicate times)."""
    return mesh[SHARD].get_group()
