"""The plan against a simulated 512-GPU world: frontier-70b built on meta, sharded with FSDP2 over torch's fake
process group (no communication), materialised as fake tensors, one forward/backward and one AdamW step.

The per-rank parameter, gradient and optimizer bytes the plan predicts must equal the sharded tensors' local
sizes exactly on the first rank (the largest shards); the last rank (the vocabulary's ragged end) is checked
for its parameter bytes, which needs no step. Parameters are checked at the full 80 blocks; the fake
forward/backward and AdamW step, whose cost grows with depth (about 0.3 s of CPU per block), run on a model of
frontier-70b's widths and vocabulary with STEP_BLOCKS blocks, whose gradients and optimizer state must equal the
plan for that depth. Runtime: about 6 s on one loaded CPU core.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from rrtrain.config import ModelConfig, TrainConfig
from rrtrain.resolve import build_model
from rrtrain.parallel.adamw import build_optimizer
from rrtrain.parallel.memory import Setup, plan

WORLD = 512
#: blocks of the model the step runs on: FSDP2 shards each block's parameters on their own, so every block adds
#: the same bytes to a rank's parameters, gradients and optimizer state; two blocks show the sum is per block
STEP_BLOCKS = 2


def local_bytes(tensors) -> int:
    return sum(t.to_local().numel() * t.to_local().element_size() if hasattr(t, "to_local")
               else t.numel() * t.element_size() for t in tensors)


def simulate(m: ModelConfig, rank: int, step: bool) -> dict[str, int]:
    """Shard as rrtrain/parallel/fsdp.py does (bf16 compute, fp32 reduction); with `step`, run one
    forward/backward and one AdamW step on fake tensors."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
    try:
        model = build_model(m, device="meta")
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        params = local_bytes(model.parameters())
        if not step:
            return {"params": params}
        with FakeTensorMode(allow_non_fake_inputs=True):
            model.to_empty(device="cpu")
            model.init_weights(0)
            idx = torch.zeros(1, 16, dtype=torch.long)
            model(idx, idx).backward()
            grads = local_bytes(p.grad for p in model.parameters())
            optimizer = build_optimizer(model, TrainConfig(), fused=False)
            optimizer.step()
            optim = local_bytes(v for state in optimizer.state.values() for v in state.values())
        return {"params": params, "grads": grads, "optim": optim}
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_frontier_70b_sharded_state_matches_plan_exactly():
    m = ModelConfig(size="frontier-70b")
    measured = simulate(m, rank=0, step=False)
    predicted = plan(Setup(m, gpus=WORLD, backend="fsdp"))
    assert predicted.category("parameters") == measured["params"]
    assert measured["params"] * WORLD >= 4 * predicted.params  # the first rank holds at least an even share
    # the step at STEP_BLOCKS of its 80 blocks: the same widths, vocabulary and shards
    short = ModelConfig(size="frontier-70b", n_layers=STEP_BLOCKS)
    measured = simulate(short, rank=0, step=True)
    predicted = plan(Setup(short, gpus=WORLD, backend="fsdp"))
    assert measured["params"] < plan(Setup(m, gpus=WORLD, backend="fsdp")).category("parameters")  # fewer blocks
    assert predicted.category("parameters") == measured["params"]
    assert predicted.category("gradients") == measured["grads"]
    assert predicted.category("optimizer") == measured["optim"]


def test_frontier_70b_last_rank_ragged_shard_matches_plan():
    m = ModelConfig(size="frontier-70b")
    measured = simulate(m, rank=WORLD - 1, step=False)
    predicted = plan(Setup(m, gpus=WORLD, backend="fsdp"), rank=WORLD - 1)
    assert predicted.category("parameters") == measured["params"]
    assert measured["params"] < plan(Setup(m, gpus=WORLD, backend="fsdp")).category("parameters")
