"""`parallel.dp_shard` x `parallel.dp_replicate`: validation, the mesh shape per world size, and the 2-D mesh
FSDP2 shards over (4 simulated ranks on torch's fake process group: no communication, so the numbers are
checked by tests/distributed/test_hsdp.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from rrtrain.config import ParallelConfig, load_config
from rrtrain.core.errors import UsageError
from rrtrain.resolve import build_model
from rrtrain.parallel.mesh import build_mesh, mesh_shape, shard_group


@pytest.mark.parametrize("overrides,message", [
    (["parallel.backend=fsdp", "parallel.dp_shard=0"], "parallel.dp_shard must be positive, got 0"),
    (["parallel.backend=fsdp", "parallel.dp_replicate=-2"], "parallel.dp_replicate must be positive, got -2"),
    (["parallel.dp_shard=2"], "parallel.dp_shard applies to parallel.backend=fsdp only (got backend 'none')"),
    (["parallel.backend=deepspeed", "parallel.dp_replicate=2"],
     "parallel.dp_replicate applies to parallel.backend=fsdp only (got backend 'deepspeed')"),
    (["parallel.backend=fsdp", "parallel.dp_shard=two"], "parallel.dp_shard: expected int or null, got 'two'"),
])
def test_bad_keys_are_one_line_errors(overrides, message):
    with pytest.raises(UsageError) as err:
        load_config(None, overrides)
    assert str(err.value) == message


@pytest.mark.parametrize("shard,replicate,world,expected", [
    (None, None, 4, (1, 4)),  # default: shard over every rank
    (2, 2, 4, (2, 2)),
    (2, None, 8, (4, 2)),  # one key alone: the other is world / it
    (None, 4, 8, (4, 2)),
    (1, 4, 4, (4, 1)),  # pure replication
])
def test_mesh_shape(shard, replicate, world, expected):
    assert mesh_shape(ParallelConfig(backend="fsdp", dp_shard=shard, dp_replicate=replicate), world) == expected


@pytest.mark.parametrize("shard,replicate,world", [(2, 2, 8), (3, None, 8), (None, 3, 4), (8, None, 4)])
def test_mesh_shape_must_cover_the_world(shard, replicate, world):
    with pytest.raises(UsageError, match=rf"parallel.dp_shard \({shard}\) x parallel.dp_replicate \({replicate}\) "
                                         rf"must equal the world size \({world}\)"):
        mesh_shape(ParallelConfig(backend="fsdp", dp_shard=shard, dp_replicate=replicate), world)


def test_hsdp_mesh_shards_within_a_group_and_replicates_across():
    cfg = load_config(None, ["parallel.backend=fsdp", "parallel.dp_shard=2", "parallel.dp_replicate=2"])
    cpu = torch.device("cpu")
    dist.init_process_group("fake", store=FakeStore(), rank=3, world_size=4)
    try:
        mesh = build_mesh(cfg.parallel, 4, cpu)
        assert mesh.mesh_dim_names == ("dp_replicate", "dp_shard") and mesh.mesh.tolist() == [[0, 1], [2, 3]]
        assert dist.get_process_group_ranks(shard_group(mesh)) == [2, 3]  # rank 3's node
        model = build_model(cfg.model)
        fully_shard(model, mesh=mesh)
        assert {p.placements for p in model.parameters()} == {(Replicate(), Shard(0))}
        flat = build_mesh(ParallelConfig(backend="fsdp"), 4, cpu)  # no replication: FSDP's 1-D mesh, as before
        assert flat.mesh_dim_names == ("dp_shard",) and flat.mesh.tolist() == [0, 1, 2, 3]
    finally:
        dist.destroy_process_group()
