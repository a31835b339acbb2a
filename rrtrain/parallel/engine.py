"""The Engine interface: what the training loop needs from a parallelism backend, and nothing about any one.

An engine owns the wrapped model, the optimizer, backward, clipping, stepping and checkpoint state. The loop
calls, per optimizer step: `forward` + `backward` for each micro-batch, then `clip_grad_norm`, then `step` or
`skip` (or `step_unless`). The backends: rrtrain/parallel/local.py (`none`), fsdp.py (`fsdp`, FSDP2/HSDP),
deepspeed.py (`deepspeed`, ZeRO); rrtrain/parallel/build.py picks one from `parallel.backend`.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from rrtrain.model.transformer import Transformer


class Engine:
    """What the training loop needs from a backend."""

    model: nn.Module  # callable as model(idx, targets) -> loss
    inner: Transformer  # the unwrapped model, for diagnostics and parameter names
    device: torch.device
    sharded: bool = False
    grad_group: Optional[torch.distributed.ProcessGroup] = None  # HSDP: the shard group (replicas hold copies)

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

    def after_step(self, nonfinite: Optional[torch.Tensor] = None) -> None:
        """The rule's optimizer-side hook (`RuleSpec.after_step`, nGPT's renormalisation), run by `step` and
        `step_unless` right after the optimizer: each parameter it names set to fn(parameter), in place, where the
        step changed the weights (`nonfinite` 0 or None), decided on the device. A parameter is what the engine holds:
        whole, or an FSDP2 DTensor shard (fn's reductions over dim 0 then span the ranks); DeepSpeed overrides this."""
        hook = getattr(getattr(self.inner, "rule", None), "after_step", None)
        if hook is None:
            return
        with torch.no_grad():
            for p, fn in hook(self.inner):
                p.copy_(fn(p) if nonfinite is None else torch.where(nonfinite.bool(), p, fn(p)))

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

    def full_model_state(self) -> dict[str, torch.Tensor]:
        """Collective: the whole model's weights (the unwrapped Transformer's state-dict names), fp32 copies on
        the CPU, consolidated from every rank's shards; complete on rank 0 (other ranks may get an empty dict).
        Every rank must call it, in the same order as the other collectives."""
        raise NotImplementedError

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        """Collective: the model's weights replaced by `state` (the whole model, as `full_model_state` gives it,
        the same on every rank); the optimizer state is left as it is (fresh, for a warm start)."""
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
