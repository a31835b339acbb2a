"""The Engine interface and the two PyTorch-native backends: one process (`none`) and FSDP2 (`fsdp`).

An engine owns the wrapped model, the optimizer, backward, clipping, stepping and checkpoint state.
The loop calls, per optimizer step: `forward` + `backward` for each micro-batch, then `clip_grad_norm`,
then `step` or `skip`. DeepSpeed's engine owns its optimizer step, so it implements the same methods
(rrtrain/parallel/deepspeed.py).
"""

from __future__ import annotations

import contextlib
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from rrtrain.config import Config
from rrtrain.core.dist import DistInfo
from rrtrain.model.transformer import Transformer, build_model
from rrtrain.training.optim import build_optimizer, set_lr
from rrtrain.parallel.ac import apply_ac
from rrtrain.parallel.materialize import materialize
from rrtrain.parallel.mesh import build_mesh, shard_group
from rrtrain.model.sizing import ModelShape


# DCP warns on every save/load in a single process that it "assumes the intent is to save in a single process":
# it is, and the warning would bury real messages.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


class Engine:
    """What the training loop needs from a backend."""

    model: nn.Module  # callable as model(idx, targets) -> loss
    inner: Transformer  # the unwrapped model, for diagnostics and parameter names

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            return self.model(idx, targets)

    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, last_micro: bool) -> None:
        raise NotImplementedError

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Global gradient norm before clipping (identical on every rank); clips when max_norm > 0."""
        raise NotImplementedError

    def step(self, lr: float) -> None:
        raise NotImplementedError

    def skip(self) -> None:
        """Discard this step's gradients without updating (non-finite loss or gradients)."""
        raise NotImplementedError

    def step_unless(self, lr: float, nonfinite: torch.Tensor) -> None:
        """`step(lr)` where the 0-dim float `nonfinite` is 0, `skip()` where it is 1: no weight, moment or step
        count changes on a skipped step. This default reads the flag on the host (a sync); engines that can
        decide on the device override it."""
        if bool(nonfinite.item()):
            self.skip()
        else:
            self.step(lr)

    def save(self, path: Path) -> None:
        """Collective: every rank writes its part of model + optimizer state under `path`."""
        raise NotImplementedError

    def save_async(self, path: Path, process_group) -> Future:  # noqa: ANN001 - a ProcessGroup or None
        """Collective: copy this rank's model + optimizer state into CPU memory now, write it under `path` in a
        background thread (its collectives on `process_group`); the future completes when every rank's files
        are written."""
        raise NotImplementedError

    def load(self, path: Path) -> None:
        raise NotImplementedError

    def grad_sq_norms(self, groups: list[list[nn.Parameter]]) -> torch.Tensor:
        """Squared gradient norm of each parameter group: (len(groups),) fp32, the same on every rank. Each rank's
        local shards are summed over `grad_group` (all ranks unless set), which must hold every shard once."""
        out = []
        for params in groups:
            total = torch.zeros((), dtype=torch.float32, device=self.device)
            for p in params:
                g = getattr(p, "grad", None)
                if g is None:
                    continue
                g = g.to_local() if hasattr(g, "to_local") else g
                total = total + g.detach().float().pow(2).sum()
            out.append(total)
        stacked = torch.stack(out) if out else torch.zeros(0, device=self.device)
        if torch.distributed.is_initialized() and self.sharded:
            torch.distributed.all_reduce(stacked, group=self.grad_group)
        return stacked

    device: torch.device
    sharded: bool = False
    grad_group: Optional[torch.distributed.ProcessGroup] = None  # HSDP: the shard group (replicas hold copies)


def is_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


def place(model: Transformer, device: torch.device, seed: int) -> None:
    """A meta-built model (training's path): this rank's tensors on `device`, initialised from `seed`.
    A model built with its weights (a caller that initialised it itself): moved to `device`."""
    if is_meta(model):
        materialize(model, device, seed)
    else:
        model.to(device)


class TorchEngine(Engine):
    """Single process, or FSDP2 (`fully_shard` on every block, then the root). The model may come built on
    the meta device: it is materialised here, after sharding, so each rank only ever allocates its shards."""

    def __init__(self, model: Transformer, cfg: Config, info: DistInfo, fsdp: bool) -> None:
        self.inner, self.device, self.sharded = model, info.device, fsdp
        p = cfg.parallel
        apply_ac(model.blocks, p.ac, p.ac_every)
        if cfg.train.compile:
            for block in model.blocks:
                block.compile()
        self.bf16_autocast = p.precision == "bf16" and not fsdp
        if fsdp:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
                if p.precision == "bf16" else MixedPrecisionPolicy()
            mesh = build_mesh(p, info.world_size, info.device)
            self.grad_group = shard_group(mesh)
            for block in model.blocks:
                fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=p.reshard_after_forward)
            fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=p.reshard_after_forward)
        place(model, info.device, cfg.train.seed)
        self.model = model
        self.optimizer = build_optimizer(model, cfg.train, fused=True)  # fused on CPU too: see step_unless
        self.fsdp = fsdp

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.bf16_autocast:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor, last_micro: bool) -> None:
        if self.fsdp:
            self.model.set_requires_gradient_sync(last_micro)  # reduce-scatter once per step
        loss.backward()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"), foreach=True)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return norm.detach().float()

    def step(self, lr: float) -> None:
        set_lr(self.optimizer, lr)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def skip(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step_unless(self, lr: float, nonfinite: torch.Tensor) -> None:
        """Decided on the device: the fused AdamW kernel returns without touching parameters or moments where
        `found_inf` is 1, and torch takes its step count back (the mechanism GradScaler uses)."""
        set_lr(self.optimizer, lr)
        self.optimizer.found_inf = nonfinite
        try:
            self.optimizer.step()
        finally:
            self.optimizer.found_inf = None
        self.optimizer.zero_grad(set_to_none=True)

    def _state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.model, self.optimizer)
        return {"model": msd, "optim": osd}

    def save(self, path: Path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self._state(), checkpoint_id=str(path))

    def save_async(self, path: Path, process_group) -> Future:  # noqa: ANN001 - a ProcessGroup or None
        import torch.distributed.checkpoint as dcp

        # The default stager deep-copies every tensor into fresh CPU storage, CPU tensors too: the optimizer
        # steps that follow cannot change what is being written.
        return dcp.async_save(self._state(), checkpoint_id=str(path), process_group=process_group)

    def load(self, path: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state()
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def build_engine(model: Transformer, cfg: Config, info: DistInfo) -> Engine:
    backend = cfg.parallel.backend
    if backend == "deepspeed":
        from rrtrain.parallel.deepspeed import DeepSpeedEngine

        return DeepSpeedEngine(model, cfg, info)
    return TorchEngine(model, cfg, info, fsdp=backend == "fsdp")


def build_training_engine(cfg: Config, shape: ModelShape, info: DistInfo) -> Engine:
    """The engine as training builds it, for the trainer and `rrtrain bench` alike: the model on the meta device,
    sharded by the engine, then each rank's part materialised and initialised from `train.seed`."""
    return build_engine(build_model(cfg.model, shape=shape, device="meta"), cfg, info)
