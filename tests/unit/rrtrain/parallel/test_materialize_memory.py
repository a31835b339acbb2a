"""Set-up memory of the sharded build: a rank allocates its own shards plus one unit, never the whole model.

A mid-size model is built on meta and handed to the real FSDP2 engine over torch's fake process group
(8 ranks, no communication), which shards it, materialises this rank's shards on the CPU and initialises
them unit by unit. torch's MemTracker counts every CPU tensor the set-up allocates; the peak must stay
within (local shards + the largest unit) x 1.1, far below the whole model. The shards must also be the
matching slices of the model built whole from the same seed.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker
from torch.testing._internal.distributed.fake_pg import FakeStore

from rrtrain.config import Config
from rrtrain.config_load import apply_overrides, build
from rrtrain.core.dist import DistInfo
from rrtrain.resolve import build_model
from rrtrain.parallel import build_engine

WORLD = 8
MODEL = ["model.size=tiny", "model.variant=mhc", "model.d_model=256", "model.n_layers=12", "model.n_heads=4",
         "model.d_ff=1024", "model.vocab_size=1000", "model.seq_len=64", "parallel.backend=fsdp", "train.seed=3",
         "train.compile=false"]


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("rank", [0, WORLD - 1])  # the largest shards, and the ragged end
def test_sharded_setup_peak_is_shards_plus_one_unit(rank):
    cfg: Config = build(Config, apply_overrides({}, MODEL))
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
    try:
        model = build_model(cfg.model, device="meta")
        units = [model.unit_template(u, device="meta") for u in range(model.n_units)]
        largest_unit = max(nbytes([*u.parameters(), *u.buffers()]) for u in units)
        whole_bytes = nbytes([*model.parameters(), *model.buffers()])
        tracker = MemTracker()
        with tracker:
            engine = build_engine(model, cfg, DistInfo(rank, WORLD, 0, torch.device("cpu")))
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
        local = {n: t.to_local() if hasattr(t, "to_local") else t
                 for n, t in [*engine.inner.named_parameters(), *engine.inner.named_buffers()]}
        shards = nbytes(local.values())
        assert shards < whole_bytes / (WORLD - 2)  # FSDP2 sharded it (buffers are replicated)
        assert peak <= 1.1 * (shards + largest_unit), (peak, shards, largest_unit)
        assert peak < whole_bytes / 2, (peak, whole_bytes)
        whole = build_model(cfg.model, seed=cfg.train.seed)
        params = dict(engine.inner.named_parameters())
        for name, full in [*whole.named_parameters(), *whole.named_buffers()]:
            mine = full  # buffers are replicated; parameters are split like torch.chunk on dim 0
            if name in params:
                chunks = torch.chunk(full, WORLD)
                mine = chunks[rank] if rank < len(chunks) else full[:0]
            assert torch.equal(local[name], mine), name
    finally:
        dist.destroy_process_group()
