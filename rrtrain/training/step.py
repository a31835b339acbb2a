"""One optimizer step and the set-up it depends on, shared by the trainer and `rrtrain bench`.

Both call these very functions, so a benchmark measures the step that training runs: accumulation over
micro-batches, the loss averaged over ranks, clipping, and AdamW skipped on a non-finite loss or norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Sequence

import torch

from rrtrain.config import TrainConfig
from rrtrain.core import dist
from rrtrain.core.dist import DistInfo
from rrtrain.core.errors import UsageError


@dataclass(frozen=True)
class StepResult:
    """What one step leaves on the device; reading it on the host is a sync, so the caller decides when."""

    loss: torch.Tensor  # mean over the step's micro-batches and ranks
    grad_norm: torch.Tensor  # before clipping
    nonfinite: torch.Tensor  # 1.0 when the step changed nothing (same on every rank)


def grad_accumulation(t: TrainConfig, world_size: int) -> int:
    """Micro-batches per rank per optimizer step; the global batch must split evenly over ranks."""
    per_step = t.micro_batch * world_size
    if t.global_batch % per_step:
        raise UsageError(f"train.global_batch={t.global_batch} is not a multiple of train.micro_batch "
                         f"({t.micro_batch}) x world size ({world_size})")
    return t.global_batch // per_step


def set_matmul_precision(precision: str) -> None:
    """`fp32_tf32` lets CUDA matmuls and convolutions use TF32; other precisions leave PyTorch's defaults."""
    if precision == "fp32_tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def optimizer_step(engine, batches: Iterator[torch.Tensor], accum: int, lr: float, grad_clip: float,
                   info: DistInfo, *, record: Sequence = (), poison: bool = False,
                   before_clip: Optional[Callable[[], None]] = None) -> StepResult:
    """Forward/backward on `accum` micro-batches from `batches` (token rows of seq_len + 1), clip, then step
    AdamW at `lr` unless the loss or the gradient norm is non-finite; no host sync.

    `record`: sites that record gate statistics during the first micro-batch (diagnostic steps).
    `poison`: multiply the loss by NaN (fault injection, to test the non-finite paths).
    `before_clip`: runs after the last backward, while the gradients are still unclipped (diagnostics).
    """
    device = info.device
    for site in record:
        site.record = True
    loss_sum = torch.zeros((), device=device)
    for micro in range(accum):
        batch = next(batches).to(device, non_blocking=True)
        loss = engine.forward(batch[:, :-1], batch[:, 1:])
        if poison:
            loss = loss * float("nan")
        engine.backward(loss / accum, last_micro=micro == accum - 1)
        loss_sum += loss.detach().float()
        for site in record:
            site.record = False
    loss_mean = dist.all_reduce(loss_sum / accum) / info.world_size
    if before_clip is not None:
        before_clip()
    grad_norm = engine.clip_grad_norm(grad_clip).to(device)
    nonfinite = (~(torch.isfinite(loss_mean) & torch.isfinite(grad_norm))).float()  # same on every rank
    engine.step_unless(lr, nonfinite)  # a non-finite step changes no weights and no optimizer state
    return StepResult(loss_mean, grad_norm, nonfinite)


def block_grad_norms(engine) -> list[float]:
    """Each block's gradient norm over all its parameters, from the gradients as they are now."""
    return engine.grad_sq_norms([list(b.parameters()) for b in engine.inner.blocks]).sqrt().tolist()


def gradient_only(engine, batch: torch.Tensor) -> list[float]:
    """Per-block gradient norms of the weights as they are, on one batch (token rows of seq_len + 1), without an
    optimizer step: the gradients are measured, then dropped (a measurement, e.g. at the end of a depth study)."""
    loss = engine.forward(batch[:, :-1], batch[:, 1:])
    engine.backward(loss, last_micro=True)
    norms = block_grad_norms(engine)
    engine.skip()
    return norms
