"""RMSNorm, the one normalisation of the model: every residual rule owns its norms (the block has none), so it
lives with the rules, below the model."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """x / rms(x) * g over the last dimension; statistics in at least fp32 (fp64 inputs stay fp64).

    `zero_centred=True` stores the gain as w and applies (1 + w), w = 0 at start (GR's per-branch norm).
    """

    def __init__(self, dim: int, eps: float = 1e-6, zero_centred: bool = False) -> None:
        super().__init__()
        self.dim, self.eps, self.zero_centred = dim, eps, zero_centred
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centred else 1.0)

    def gain(self) -> torch.Tensor:
        """The multiplier applied after normalising: g, or 1 + w when zero-centred."""
        return 1.0 + self.weight if self.zero_centred else self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gain = self.gain()
        acc = torch.promote_types(x.dtype, torch.float32)
        y = F.rms_norm(x.to(acc), (x.shape[-1],), gain.to(acc), self.eps)
        return y.to(x.dtype)


def inv_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(|x|^2 + d eps) per row, (..., 1), in at least fp32, so that an RMSNorm with gain g and epsilon
    eps is x * inv_rms(x, eps) * (sqrt(d) * g): for callers that fold the normalisation into a following matmul
    instead of materialising it (one pass over x, then a few ops on one scalar per row)."""
    acc = torch.promote_types(x.dtype, torch.float32)
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=acc)
    return torch.rsqrt(norm.square() + x.shape[-1] * eps)


def unit_rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm without a gain, statistics in at least fp32."""
    return F.rms_norm(x.to(torch.promote_types(x.dtype, torch.float32)), (x.shape[-1],), None, eps).to(x.dtype)
