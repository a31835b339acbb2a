"""GR: the multi-branch Gated Residual of Qwen3.8-Flash-Next / qwen4_exp (docs/residuals.md).

Legend:  b batch · t tokens · n branches · d model width · r controller rank
    R̂    = RMSN_i(R) ⊙ (1 + w)                    per-branch statistics, gain w ∈ R^{n×d}     (b, t, n, d)
    G    = σ(W_up silu(W_down vec(R̂) / n))        per-branch, per-component read gates      (b, t, n, d)
    x    = (1/n) Σ_i G_i ⊙ R̂_i                     the sublayer's input; F adds no pre-norm   (b, t, d)
    s    = 2σ(W_inj vec(R̂) / n)                    one write scalar per branch               (b, t, n)
    R'_i = R_i + s_i · y                           the bypass keeps each raw branch; no mixing
expand tiles the embedding; readout is one more read (own controller, no W_inj) fed straight to the
LM head, with no extra final norm: x is already built from normalised branches.

Initialisation (our choice): w = 0, W_down ~ N(0, 1/(n·d)), W_up, W_inj ~ N(0, 0.02²). All-zero
controllers would keep the tiled branches identical forever (identical updates, identical gradients).
The gain w is held as one (n, d) parameter (one pass over all branches) and declared in `no_decay`: like every
other rule's norm gains it is never weight-decayed, although it has two dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .base import RuleKnobs, RuleSpec, Site, SiteInfo, StreamInfo, require
from .composition import Composition
from .streams import StreamKnobs, TiledStream, rms_rstd, upcast, write_back

RANK_DIVISOR = 8  # gr_rank = 0 means r = d / 8, the released config (d = 2560, r = 320)
UP_INJ_STD = 0.02  # W_up and W_inj: the HF / Megatron default initializer_range


@dataclass
class GRKnobs:
    gr_rank: int = 0  # GR controller rank; 0 = d_model // 8

    def check(self) -> None:
        require(self, non_negative=("gr_rank",))


def gr_rank(d: int, cfg: RuleKnobs) -> int:
    return cfg.gr_rank if cfg.gr_rank > 0 else max(1, d // RANK_DIVISOR)


def branch_norm(r: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-branch RMSNorm with zero-centred gain: (b, t, n, d), w (n, d) -> (b, t, n, d) in fp32.

    r · rstd promotes to fp32 without keeping an fp32 copy of a bf16 state for backward.
    """
    return r * rms_rstd(r, eps) * (1.0 + upcast(w))


def gr_read(r_hat: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """x = (1/n) Σ_i G_i ⊙ R̂_i: divided by the branch count, not by the sum of the gates."""
    return (g * r_hat).mean(-2)


class GRController(nn.Module):
    """The branch norm and the low-rank read controller, plus the write controller when `write`."""

    def __init__(self, d: int, n: int, rank: int, eps: float, write: bool) -> None:
        super().__init__()
        self.n, self.d, self.eps = n, d, eps
        self.norm_weight = nn.Parameter(torch.empty(n, d))
        self.down = nn.Linear(n * d, rank, bias=False)
        self.up = nn.Linear(rank, n * d, bias=False)
        self.inj = nn.Linear(n * d, n, bias=False) if write else None

    @staticmethod
    def count(d: int, n: int, rank: int, write: bool) -> int:
        return n * d * (2 * rank + 1 + (n if write else 0))

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        with torch.no_grad():
            self.norm_weight.zero_()
            nn.init.normal_(self.down.weight, std=(self.n * self.d) ** -0.5, generator=generator)
            nn.init.normal_(self.up.weight, std=UP_INJ_STD, generator=generator)
            if self.inj is not None:
                nn.init.normal_(self.inj.weight, std=UP_INJ_STD, generator=generator)

    def forward(self, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """R (b, t, n, d) -> x (b, t, d), s (b, t, n) or None, G (b, t, n, d); fp32 out."""
        r_hat = branch_norm(r, self.norm_weight, self.eps)
        flat = r_hat.flatten(-2).to(self.down.weight.dtype)  # matmuls in the parameters' dtype
        u = F.silu(upcast(self.down(flat)) / self.n)  # (b, t, r)
        g = torch.sigmoid(upcast(self.up(u.to(flat.dtype)))).unflatten(-1, (self.n, self.d))
        s = 2.0 * torch.sigmoid(upcast(self.inj(flat)) / self.n) if self.inj is not None else None
        return gr_read(r_hat, g), s, g


class GRSite(Site):
    """One GR site: the read gates the sublayer's input, the write adds s_i·y to each raw branch."""

    no_decay = ("ctrl.norm_weight",)  # the branch norm's gain: 2-D (n, d), so the < 2-D rule would decay it

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        d, cfg = info.d_model, info.cfg
        self.ctrl = GRController(d, cfg.streams, gr_rank(d, cfg), info.eps, write=True)
        self.reset_parameters()

    @staticmethod
    def count(d: int, cfg: RuleKnobs) -> int:
        return GRController.count(d, cfg.streams, gr_rank(d, cfg), write=True)

    def read(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, s, g = self.ctrl(state)
        self._record_gate(g)
        return x.to(state.dtype), s

    def write(self, state: torch.Tensor, y: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        return write_back(state, None, ctx, y)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.ctrl.reset_parameters(generator)


class GRStream(TiledStream):
    """expand: tile the embedding; readout: a final read (the `hyper_connection_mixer`), no final norm."""

    no_decay = ("mixer.norm_weight",)

    def __init__(self, info: StreamInfo) -> None:
        super().__init__(info)
        d, cfg = info.d_model, info.cfg
        self.mixer = GRController(d, cfg.streams, gr_rank(d, cfg), info.eps, write=False)
        self.reset_parameters()

    @staticmethod
    def count(d: int, cfg: RuleKnobs) -> int:
        return GRController.count(d, cfg.streams, gr_rank(d, cfg), write=False)

    def readout(self, state: torch.Tensor) -> torch.Tensor:
        return self.mixer(state)[0].to(state.dtype)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.mixer.reset_parameters(generator)


SPEC = RuleSpec(
    name="gr", site=GRSite, stream=GRStream, knobs=(StreamKnobs, GRKnobs), gated=True,
    # every controller matrix has a fan-in that grows with d (n*d, or the rank d/8); W_up and W_inj are drawn at
    # a fixed std, W_down with 1/(n*d) variance already
    composition=Composition(matrices=("*.down.weight", "*.up.weight", "*.inj.weight"),
                            scaled_init=("*.up.weight", "*.inj.weight"), vectors=("*.norm_weight",)),
    summary="n branches; x = mean_i G_i*RMSN(R_i), R_i += 2sigma(.)*y (Gated Residual, Qwen3.8-Flash-Next)",
)
