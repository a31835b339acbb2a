"""`parallel.backend: fsdp`: FSDP2 (`fully_shard` on every block, then the root) over a 1-D mesh, or HSDP over
the 2-D mesh of rrtrain/parallel/mesh.py. bf16 runs through FSDP's mixed-precision policy (bf16 compute, fp32
reductions), not autocast. A meta-built model is materialised after sharding, so each rank only ever
allocates its shards."""

from __future__ import annotations

import torch

from rrtrain.config import Config
from rrtrain.core.dist import DistInfo
from rrtrain.model.transformer import Transformer
from rrtrain.parallel.float8 import needs_scale_precompute, precompute_scales
from rrtrain.parallel.materialize import place
from rrtrain.parallel.mesh import build_mesh, shard_group
from rrtrain.parallel.native import NativeEngine
from rrtrain.parallel.prepare import prepare_blocks


class FSDPEngine(NativeEngine):
    """Parameters, gradients and optimizer state sharded per parameter; gradients reduce-scattered once a step."""

    sharded = True

    def __init__(self, model: Transformer, cfg: Config, info: DistInfo) -> None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        p = cfg.parallel
        prepare_blocks(model, cfg, fsdp=True)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if p.precision == "bf16" else MixedPrecisionPolicy()
        mesh = build_mesh(p, info.world_size, info.device)
        self.grad_group = shard_group(mesh)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=p.reshard_after_forward)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=p.reshard_after_forward)
        place(model, info.device, cfg.train.seed)
        super().__init__(model, cfg, info.device)
        self.float8_scales = needs_scale_precompute(model)  # tensorwise float8 all-gather
        if self.float8_scales:
            precompute_scales(model)  # the first forward's scales, as after every step

    def step(self, lr: float) -> None:
        super().step(lr)
        if self.float8_scales:
            precompute_scales(self.model)

    def step_unless(self, lr: float, nonfinite: torch.Tensor) -> None:
        super().step_unless(lr, nonfinite)
        if self.float8_scales:
            precompute_scales(self.model)

    def backward(self, loss: torch.Tensor, last_micro: bool) -> None:
        self.model.set_requires_gradient_sync(last_micro)  # reduce-scatter once per step
        loss.backward()
