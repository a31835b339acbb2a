"""The plan against a simulated 512-GPU world: frontier-70b built on meta, sharded with FSDP2 over torch's fake
process group (no communication), materialised as fake tensors, one forward/backward and one AdamW step.

The per-rank parameter, gradient and optimizer bytes the plan predicts must equal the sharded tensors' local
sizes exactly, for the first rank (the largest shards) and the last (the vocabulary's ragged end).
Runtime: about 30 s per rank on one loaded CPU core.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from rrtrain.config import ModelConfig, TrainConfig
from rrtrain.model import build_model
from rrtrain.optim import build_optimizer
from rrtrain.plan import Setup, plan

WORLD = 512


def local_bytes(tensors) -> int:
    return sum(t.to_local().numel() * t.to_local().element_size() if hasattr(t, "to_local")
               else t.numel() * t.element_size() for t in tensors)


def simulate(m: ModelConfig, rank: int) -> dict[str, int]:
    """Shard as rrtrain/parallel/engine.py does (bf16 compute, fp32 reduction), run one step on fake tensors."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
    try:
        model = build_model(m, device="meta")
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        params = local_bytes(model.parameters())
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            model.init_weights()
            idx = torch.zeros(1, 16, dtype=torch.long)
            model(idx, idx).backward()
            grads = local_bytes(p.grad for p in model.parameters())
            optimizer = build_optimizer(model, TrainConfig(), fused=False)
            optimizer.step()
            optim = local_bytes(v for state in optimizer.state.values() for v in state.values())
        return {"params": params, "grads": grads, "optim": optim}
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("rank", [0, WORLD - 1])
def test_frontier_70b_sharded_state_matches_plan_exactly(rank):
    m = ModelConfig(size="frontier-70b")
    measured = simulate(m, rank)
    predicted = plan(Setup(m, gpus=WORLD, backend="fsdp"), rank=rank)
    assert predicted.category("parameters") == measured["params"]
    assert predicted.category("gradients") == measured["grads"]
    assert predicted.category("optimizer") == measured["optim"]
    if rank == 0:  # the first rank holds the largest shard of every tensor: at least an even share
        assert measured["params"] * WORLD >= 4 * predicted.params
