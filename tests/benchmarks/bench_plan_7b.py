"""frontier-7b over 64 fake ranks: one rank's shards materialised on the CPU, one forward/backward and one
AdamW step at a short sequence (fp32), its measured peak against the plan's (target: within 20%).

The model is built on meta and sharded with FSDP2 over torch's fake process group, as
tests/unit/rrtrain/parallel/test_memory_fake_world.py does, but here rank 0's shards are real CPU tensors and the step
runs for real on them (the fake all-gathers return uninitialised buffers of the right size, so the values are
meaningless and the memory is real). Memory is counted by torch's MemTracker. Needs about 5 GB of RAM and
a few minutes of one core: not part of `make test`.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

from rrtrain.config import ModelConfig, TrainConfig
from rrtrain.resolve import build_model
from rrtrain.parallel.adamw import build_optimizer
from rrtrain.parallel.memory import Setup, plan

WORLD, SEQ, MICRO = 64, 32, 1


def test_frontier_7b_one_rank_peak_within_20_percent_of_plan():
    m = ModelConfig(size="frontier-7b", seq_len=SEQ)
    t0 = time.perf_counter()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    try:
        model = build_model(m, device="meta")
        for block in model.blocks:
            fully_shard(block)  # fp32 on CPU: no mixed-precision policy, as the trainer with precision=fp32
        fully_shard(model)
        tracker = MemTracker()
        with tracker:
            model.to_empty(device="cpu")
            model.init_weights(0)
            optimizer = build_optimizer(model, TrainConfig(), fused=False)
            idx = torch.zeros(MICRO, SEQ, dtype=torch.long)
            model(idx, idx).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        measured = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    finally:
        dist.destroy_process_group()
    predicted = plan(Setup(m, gpus=WORLD, precision="fp32", micro_batch=MICRO)).total()
    ratio = predicted / measured
    print(f"\nfrontier-7b, 64 fake ranks, rank 0, seq {SEQ}, fp32: measured peak {measured / 2**30:.2f} GiB, "
          f"plan {predicted / 2**30:.2f} GiB, plan/measured {ratio:.3f} ({time.perf_counter() - t0:.0f} s)")
    assert abs(ratio - 1) <= 0.20
