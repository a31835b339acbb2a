"""mHC: Manifold-Constrained Hyper-Connections (DeepSeek-AI, 2025).

Legend:  b batch · t tokens · n streams · d model width · s = vec(S) ∈ R^{n·d} per token
    z      = RMSN_unit(s) Φ                       one norm over all n·d features (gain folded into Φ)
    H_pre  = σ(α_pre  z_pre  + b_pre)             (b, t, n)     in (0, 1): no cancellation between streams
    H_post = 2σ(α_post z_post + b_post)           (b, t, n)     in (0, 2)
    H_res  = Sinkhorn(α_res z_res + b_res)        (b, t, n, n)  rows = DESTINATION (paper convention)
    x      = Σ_i H_pre_i S_i;  y = F(RMSN(x));  S'_j = Σ_i H_res[j, i] S_i + H_post_j y
Init (near identity): Φ ~ N(0, PHI_STD²), α = `mhc_alpha_init`, b_pre = −log(n − 1) (read = stream
mean), b_post = 0 (H_post = 1), b_res = `mhc_offdiag_logit` off the diagonal (H_res ≈ 0.98 I at n = 4).
readout (DeepSeek-V4 HyperHead): w = σ(scale · RMSN_unit(s) Φ_head + base) + eps, z = Σ_i w_i S_i,
then the final RMSNorm. All coefficient and Sinkhorn math in fp32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .base import RuleKnobs, RuleSpec, Site, SiteInfo, StreamInfo, require
from .composition import Composition
from .norm import RMSNorm
from .streams import StreamKnobs, TiledStream, acc_dtype, combine, rms_rstd, upcast, write_back

PHI_STD = 1e-4  # Φ and Φ_head init std: the Megatron-derived port (small, not zero: α gets a gradient)


@dataclass
class MHCKnobs:
    sinkhorn_iters: int = 20  # mHC: Sinkhorn-Knopp iterations (fp32)
    sinkhorn_eps: float = 1e-6  # mHC: epsilon in the Sinkhorn denominators
    mhc_alpha_init: float = 0.01  # mHC: initial alpha_pre / alpha_post / alpha_res
    mhc_offdiag_logit: float = -5.0  # mHC: initial off-diagonal H_res logit (near-identity start)

    def check(self) -> None:
        require(self, positive=("sinkhorn_iters",))


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Sinkhorn-Knopp on (.., n, n) logits: exp, then `iters` × (column step, row step), in fp32 or wider.

    Max-subtracted before exp; `eps` floors every denominator (bf16-born logits can make a sum tiny) rather
    than being added to it, so rows sum to 1 to rounding after the last (row) step.
    """
    lg = upcast(logits)
    m = torch.exp(lg - lg.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iters):
        m = m / m.sum(-2, keepdim=True).clamp_min(eps)  # columns
        m = m / m.sum(-1, keepdim=True).clamp_min(eps)  # rows
    return m


def projected_mixes(s: torch.Tensor, phi: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSN_unit(vec S) Φ with the division by the RMS moved after the matmul: (b, t, n, d) -> (b, t, k)."""
    flat = s.flatten(-2)
    return (flat @ phi.to(flat.dtype)).to(acc_dtype(s)) * rms_rstd(flat, eps)


class MHCSite(Site):
    """One mHC site; Φ's columns are [pre (n) | post (n) | res (n², row-major, rows = destination)]."""

    no_decay = ("alpha", "bias")

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        d, n = info.d_model, info.cfg.streams
        self.n = n
        # plain attributes: forward reads no config (a knob read there made dynamo guard on the section)
        self.sinkhorn_iters, self.sinkhorn_eps = info.cfg.sinkhorn_iters, info.cfg.sinkhorn_eps
        self.norm = RMSNorm(d, info.eps)  # the sublayer's own pre-norm
        self.phi = nn.Parameter(torch.empty(n * d, n * n + 2 * n))
        self.alpha = nn.Parameter(torch.empty(3))  # α_pre, α_post, α_res
        self.bias = nn.Parameter(torch.empty(n * n + 2 * n))
        self.reset_parameters()

    @staticmethod
    def count(d: int, cfg: RuleKnobs) -> int:
        n = cfg.streams
        return d + n * d * (n * n + 2 * n) + n * n + 2 * n + 3

    def coefficients(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """H_pre (b, t, n), H_post (b, t, n), H_res (b, t, n, n) in fp32."""
        n = self.n
        z = projected_mixes(s, self.phi, self.info.eps)
        al, bias = upcast(self.alpha), upcast(self.bias)
        h_pre = torch.sigmoid(al[0] * z[..., :n] + bias[:n])
        h_post = 2.0 * torch.sigmoid(al[1] * z[..., n:2 * n] + bias[n:2 * n])
        res_logits = (al[2] * z[..., 2 * n:] + bias[2 * n:]).unflatten(-1, (n, n))
        # recomputed in backward: its 2·iters steps would otherwise keep ~6·iters·n² floats per token
        h_res = checkpoint(sinkhorn, res_logits, self.sinkhorn_iters, self.sinkhorn_eps, use_reentrant=False)
        return h_pre, h_post, h_res

    def mix_in(self, s: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The read before the sublayer's pre-norm: x (b, t, d) in fp32, ctx = (H_post, H_res)."""
        h_pre, h_post, h_res = self.coefficients(s)
        self._record_gate(h_pre)
        return combine(h_pre, s), (h_post, h_res)

    def read(self, state: torch.Tensor) -> tuple[torch.Tensor, Any]:
        x, ctx = self.mix_in(state)
        return self.norm(x.to(state.dtype)), ctx

    def write(self, state: torch.Tensor, y: torch.Tensor, ctx: Any) -> torch.Tensor:
        h_post, h_res = ctx
        return write_back(state, h_res.transpose(-1, -2), h_post, y)  # mix() takes rows = source

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.norm.reset_parameters()
        n, cfg = self.n, self.info.cfg
        with torch.no_grad():
            nn.init.normal_(self.phi, std=PHI_STD, generator=generator)
            self.alpha.fill_(cfg.mhc_alpha_init)
            off_diag = 1.0 - torch.eye(n, device=self.bias.device)
            self.bias[:n] = -math.log(max(n - 1, 1))  # H_pre = 1/n (n = 1: 1/2, absorbed by the pre-norm)
            self.bias[n:2 * n] = 0.0
            self.bias[2 * n:] = (cfg.mhc_offdiag_logit * off_diag).flatten()


class MHCStream(TiledStream):
    """expand: n copies of the embedding; readout: DeepSeek-V4's HyperHead, then the final RMSNorm."""

    no_decay = ("head_base", "head_scale")

    def __init__(self, info: StreamInfo) -> None:
        super().__init__(info)
        d, n = info.d_model, self.n
        self.sinkhorn_eps = info.cfg.sinkhorn_eps
        self.head_fn = nn.Parameter(torch.empty(n * d, n))
        self.head_base = nn.Parameter(torch.empty(n))
        self.head_scale = nn.Parameter(torch.empty(1))
        self.norm = RMSNorm(d, info.eps)
        self.reset_parameters()

    @staticmethod
    def count(d: int, cfg: RuleKnobs) -> int:
        n = cfg.streams
        return n * d * n + n + 1 + d

    def readout(self, state: torch.Tensor) -> torch.Tensor:
        z = projected_mixes(state, self.head_fn, self.info.eps)  # (b, t, n)
        w = torch.sigmoid(upcast(self.head_scale) * z + upcast(self.head_base)) + self.sinkhorn_eps
        return self.norm(combine(w, state)).to(state.dtype)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.norm.reset_parameters()
        with torch.no_grad():
            nn.init.normal_(self.head_fn, std=PHI_STD, generator=generator)
            self.head_base.zero_()
            self.head_scale.fill_(self.info.cfg.mhc_alpha_init)


SPEC = RuleSpec(
    name="mhc", site=MHCSite, stream=MHCStream, knobs=(StreamKnobs, MHCKnobs), gated=True,
    # Phi and the head's Phi read vec(S) (fan-in n*d) and are drawn at a fixed std
    composition=Composition(matrices=("phi", "head_fn"), scaled_init=("phi", "head_fn"),
                            vectors=("norm.weight", "alpha", "bias", "head_base", "head_scale")),
    summary="n streams; S' = Sinkhorn(H_res) S + 2sigma(.) y, read sigma(.) (manifold-constrained HC)",
)
