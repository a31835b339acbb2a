"""Frac-connections (Zhu et al., arXiv 2503.14125): hyper-connections with an expansion rate n = 1/m < 1, the state
(b, t, d) split into m fractions of width c = d/m that are mixed HC-style, rather than copied n times. As lucidrains'
`hyper-connections` computes it (`HyperConnections(1, dim=d, num_fracs=m)`), the peer this rule is checked against.

Legend:  b batch · t tokens · d model width · m fractions (`frac_fracs`) · c = d/m · R_f the state's fraction f (c)
    R̄_f  = normalize(R_f) · √c · (1 + γ)                    each fraction RMS-normalised, one gain γ (c) shared
    α    = α0 + s_α tanh(R̄ W_α)       (b, t, m, 2m): row f1 from R̄_f1, columns (f2, j) with j = 0 the sublayer's
                                       input, j = 1 the carry (lucidrains' layout of `static_alpha`)
    β    = β0 + s_β tanh(R̄ W_β)       (b, t, m, m): [f1, f2], β0 (m,) per destination f2
    x_f2 = Σ_f1 α[f1, (f2, 0)] R_f1     the sublayer's input, the m fractions side by side (then the pre-norm)
    y    = F(RMSN(x))
    R'_f2 = Σ_f1 α[f1, (f2, 1)] R_f1 + Σ_f1 β[f1, f2] y_f1
init (lucidrains'): α0 = [1 on row 0 | I_m] in its (f2, j) column order, β0 = 1, W_α = W_β = 0, γ = 0,
s_α = s_β = 0.01. In that order, at start the input is fraction 0 in every fraction's place, the carry keeps R, and
every fraction receives the sum of y's fractions: not the standard residual (m = 1 is: HC with one stream).
readout: RMSN_f(h), the fractions side by side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .base import RuleKnobs, RuleSpec, Site, SiteInfo, require
from .composition import Composition
from .norm import RMSNorm
from .single import SingleStream
from .streams import upcast


@dataclass
class FracKnobs:
    frac_fracs: int = 2  # m: fractions of the state (n = 1/m); the width must be a multiple of it
    frac_scale_init: float = 0.01  # s_α = s_β at start (lucidrains': 1e-2)

    def check(self) -> None:
        require(self, positive=("frac_fracs",))


class FracSite(Site):
    """One Frac-connection around a sublayer."""

    no_decay = ("frac_gain", "static_alpha", "dynamic_alpha", "alpha_scale", "static_beta", "dynamic_beta",
                "beta_scale")

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        d, m = info.d_model, info.cfg.frac_fracs
        if d % m:
            raise ValueError(f"model.residual.frac_fracs={m} must divide the model width {d}")
        c = d // m
        self.m, self.c = m, c
        self.norm = RMSNorm(d, info.eps)  # the sublayer's own pre-norm
        self.frac_gain = nn.Parameter(torch.empty(c))  # γ
        self.static_alpha = nn.Parameter(torch.empty(m, 2 * m))
        self.dynamic_alpha = nn.Parameter(torch.empty(c, 2 * m))  # W_α
        self.alpha_scale = nn.Parameter(torch.empty(1))
        self.static_beta = nn.Parameter(torch.empty(m))
        self.dynamic_beta = nn.Parameter(torch.empty(c, m))  # W_β
        self.beta_scale = nn.Parameter(torch.empty(1))
        self.reset_parameters()

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        m = cfg.frac_fracs
        c = d // m
        return d + c + 2 * m * m + 2 * m * c + 1 + m + m * c + 1

    def read(self, state: torch.Tensor) -> tuple[torch.Tensor, Any]:
        b, t, d = state.shape
        r = upcast(state).view(b, t, self.m, self.c)  # (b, t, f1, c), fp32 or wider
        normed = F.normalize(r, dim=-1) * math.sqrt(self.c) * (upcast(self.frac_gain) + 1.0)
        alpha = torch.tanh(normed @ upcast(self.dynamic_alpha)) * upcast(self.alpha_scale) + upcast(self.static_alpha)
        alpha = alpha.view(b, t, self.m, self.m, 2)  # (b, t, f1, f2, j)
        beta = torch.tanh(normed @ upcast(self.dynamic_beta)) * upcast(self.beta_scale) + upcast(self.static_beta)
        mixed = torch.einsum("btfgj,btfc->btgjc", alpha, r)  # (b, t, f2, j, c)
        x = mixed[..., 0, :].reshape(b, t, d)
        return self.norm(x.to(state.dtype)), (mixed[..., 1, :], beta)

    def write(self, state: torch.Tensor, y: torch.Tensor, ctx: Any) -> torch.Tensor:
        carry, beta = ctx  # (b, t, f2, c), (b, t, f1, f2)
        b, t, d = y.shape
        out = torch.einsum("btfc,btfg->btgc", upcast(y).view(b, t, self.m, self.c), beta)
        return (carry + out).reshape(b, t, d).to(state.dtype)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.norm.reset_parameters()
        m = self.m
        with torch.no_grad():
            self.frac_gain.zero_()
            self.static_alpha.zero_()
            self.static_alpha[0, :m] = 1.0  # lucidrains' init_alpha0 (row layer_index % num_streams = 0), then I_m
            self.static_alpha[:, m:].copy_(torch.eye(m, device=self.static_alpha.device))
            self.dynamic_alpha.zero_()
            self.alpha_scale.fill_(self.info.cfg.frac_scale_init)
            self.static_beta.fill_(1.0)
            self.dynamic_beta.zero_()
            self.beta_scale.fill_(self.info.cfg.frac_scale_init)


def flops(d: int, n_sublayers: int, cfg: RuleKnobs) -> int:
    """Per sublayer per token beyond 6 per parameter: W_α and W_β (3mc weights) act on each of the m fractions,
    6·3mc·(m − 1) more; the two mixes, 2·2m·m·c and 2·m·m·c forward, times 3 with backward: 18d(2m − 1) in all."""
    return 18 * d * (2 * cfg.frac_fracs - 1) * n_sublayers


SPEC = RuleSpec(name="frac", site=FracSite, stream=SingleStream, knobs=(FracKnobs,), flops=flops,
                # the multiplier on the update u (beta y); W_alpha and W_beta read a fraction (fan-in d/m, zero at
                # start); the static alpha mixes the carried fractions (and the input's): carry scalars
                composition=Composition(matrices=("dynamic_alpha", "dynamic_beta"), carry_scalars=("static_alpha",),
                                        vectors=("norm.weight", "frac_gain", "alpha_scale", "static_beta",
                                                 "beta_scale")),
                summary="m fractions of the state mixed HC-style (Frac-connections, n = 1/m; lucidrains' num_fracs)")
