"""Shared arithmetic of the multi-stream rules (GR, HC, mHC): a residual state of n copies of the stream.

Legend:  b batch · t tokens · n streams (GR calls them branches) · d model width
    S        (b, t, n, d)   the state; stream index outer, d inner, so S.flatten(-2) is the packed
                            n·d layout of DeepSeek-V4 and Qwen4-Exp checkpoints
    w        (b, t, n) or (n,)         read weights      -> combine(w, S) = Σ_i w_i S_i       (b, t, d)
    M        (b, t, n, n) or (n, n)    mixing, rows = source -> mix(M, S)_j = Σ_i M[i, j] S_i (b, t, n, d)

Coefficients are computed in (at least) fp32 while the state keeps the model's dtype. `combine`, `mix` and
`rms_rstd` let type promotion do the fp32 accumulation, so autograd keeps the original low-precision state
for backward rather than an fp32 copy of it: the n-fold state is what dominates these rules' memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Stream, StreamInfo, require


@dataclass
class StreamKnobs:
    """The knob every multi-stream rule shares (declared once, listed in each of their specs)."""

    streams: int = 4  # n: copies of the residual stream for multi-stream rules (gr, hc, mhc)

    def check(self) -> None:
        require(self, positive=("streams",))


def upcast(x: torch.Tensor) -> torch.Tensor:
    """x in fp32, or as is if already fp32/fp64 (float64 test vectors keep their precision)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def acc_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def tile(e: torch.Tensor, n: int) -> torch.Tensor:
    """(b, t, d) -> (b, t, n, d): every stream starts as the embedding.

    A contiguous copy, not a broadcast view: every block then receives a state of the same strides, so a
    compiled block is one graph for all blocks (a view gave the first block a graph of its own). The copy
    costs one state of memory, next to the one per block that training keeps for backward anyway.
    """
    return e.unsqueeze(-2).expand(*e.shape[:-1], n, e.shape[-1]).contiguous()


def rms_rstd(x: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(mean(x²) + eps) over the last dim, in fp32, keepdim. Saves only x itself for backward."""
    ms = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=acc_dtype(x)).square() / x.shape[-1]
    return torch.rsqrt(ms + eps)


def combine(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Σ_i w_i S_i: (.., n) weights, (b, t, n, d) state -> (b, t, d) in the weights' (fp32) precision."""
    return (w.unsqueeze(-1) * s).sum(-2)


def mix(m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """S'_j = Σ_i M[i, j] S_i with rows = source: (.., n, n), (b, t, n, d) -> (b, t, n, d), fp32 or wider.

    A matmul when the state is already wide (autocast off: it would round the coefficients to bf16);
    otherwise n broadcast products, which keep the bf16 state (not an fp32 copy) for backward.
    """
    if s.dtype == m.dtype:
        mt = m.transpose(-1, -2).expand(*s.shape[:-2], m.shape[-1], m.shape[-2])  # a static (n, n) too:
        with torch.autocast(s.device.type, enabled=False):  # else matmul folds S into a transposed copy
            return mt @ s
    out = m[..., 0, :, None] * s[..., 0:1, :]
    for i in range(1, s.shape[-2]):
        out = out + m[..., i, :, None] * s[..., i:i + 1, :]
    return out


def write_back(s: torch.Tensor, m: torch.Tensor | None, b: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """S' = mix(M, S) + b y (M = None: no mixing), back in the state's dtype."""
    bypass = s if m is None else mix(m, s)
    return (bypass + b.unsqueeze(-1) * y.unsqueeze(-2)).to(s.dtype)


class TiledStream(Stream):
    """expand: n copies of the embedding. Subclasses choose the readout."""

    def __init__(self, info: StreamInfo) -> None:
        super().__init__(info)
        self.n = info.cfg.streams

    def expand(self, e: torch.Tensor) -> torch.Tensor:
        return tile(e, self.n)
