"""RMSNorm, the one normalisation every part of the model and every residual rule uses."""

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gain = 1.0 + self.weight if self.zero_centred else self.weight
        acc = torch.promote_types(x.dtype, torch.float32)
        y = F.rms_norm(x.to(acc), (x.shape[-1],), gain.to(acc), self.eps)
        return y.to(x.dtype)


def unit_rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm without a gain, statistics in at least fp32."""
    return F.rms_norm(x.to(torch.promote_types(x.dtype, torch.float32)), (x.shape[-1],), None, eps).to(x.dtype)
