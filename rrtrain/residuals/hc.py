"""HC: Hyper-Connections, static and dynamic (Zhu et al., ICLR 2025).

Legend:  b batch · t tokens · n streams · d model width · k sublayer index (0-based)
    x    = Σ_i a_i S_i                          read ("width connection")            (b, t, d)
    y    = F(RMSN(x))                           the sublayer keeps its own pre-norm
    S'_j = Σ_i A[i, j] S_i + b_j y              rows of A = SOURCE stream, columns = destination
static:  a, A, b are parameters; init a = e_{k mod n}, A = I, b = 1 (n copies of a pre-norm residual).
dynamic: with S̄_i = RMSN(S_i) ⊙ (1 + γ) per stream and shared projections w_a (d), W_A (d, n), w_b (d):
    a_i = a0_i + s_a tanh(S̄_i·w_a),  A[i, :] = A0[i, :] + s_a tanh(S̄_i W_A),  b_i = b0_i + s_b tanh(S̄_i·w_b)
    projections and γ start at 0 (dynamic = static at init), s_a = s_b = `hc_scale_init`.
readout: Σ_i S_i, then the final RMSNorm (sum → norm ≡ mean → norm).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from .base import RuleKnobs, RuleSpec, Site, SiteInfo, StreamInfo
from .composition import Composition
from .norm import RMSNorm
from .streams import StreamKnobs, TiledStream, acc_dtype, combine, rms_rstd, upcast, write_back


@dataclass
class HCKnobs:
    hc_dynamic: bool = True  # HC: dynamic (token-dependent) coefficients on top of the static ones
    hc_scale_init: float = 0.01  # HC: initial s_a = s_b


class HCSite(Site):
    """One HC site. The dynamic projections are packed as columns [w_a | W_A | w_b] of `dyn_proj` (d, n + 2)."""

    # HC's connection parameters excluded from weight decay (lucidrains/hyper-connections#4)
    no_decay = ("static_a", "static_A", "static_b", "dyn_proj", "scale_a", "scale_b")

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        d, n = info.d_model, info.cfg.streams
        self.n, self.dynamic = n, info.cfg.hc_dynamic
        self.norm = RMSNorm(d, info.eps)  # the sublayer's own pre-norm
        self.static_a = nn.Parameter(torch.empty(n))
        self.static_A = nn.Parameter(torch.empty(n, n))
        self.static_b = nn.Parameter(torch.empty(n))
        if self.dynamic:
            self.dyn_gain = nn.Parameter(torch.empty(d))  # γ: per-stream norm gain (1 + γ)
            self.dyn_proj = nn.Parameter(torch.empty(d, n + 2))
            self.scale_a = nn.Parameter(torch.empty(1))
            self.scale_b = nn.Parameter(torch.empty(1))
        self.reset_parameters()

    @staticmethod
    def count(d: int, cfg: RuleKnobs) -> int:
        n = cfg.streams
        dynamic = d + d * (n + 2) + 2 if cfg.hc_dynamic else 0
        return d + n * n + 2 * n + dynamic

    def coefficients(self, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """a (.., n), A (.., n, n), b (.., n): static (n,)-shaped, or per token (b, t, ..) when dynamic."""
        a, A, b = upcast(self.static_a), upcast(self.static_A), upcast(self.static_b)
        if not self.dynamic:
            return a, A, b
        w = ((1.0 + upcast(self.dyn_gain)).unsqueeze(-1) * upcast(self.dyn_proj)).to(s.dtype)
        z = torch.tanh((s @ w).to(acc_dtype(s)) * rms_rstd(s, self.info.eps))  # (b, t, n, n + 2), row i from S_i
        sa, sb = upcast(self.scale_a), upcast(self.scale_b)
        return a + sa * z[..., 0], A + sa * z[..., 1:self.n + 1], b + sb * z[..., self.n + 1]

    def mix_in(self, s: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """The width connection before the sublayer's pre-norm: x (b, t, d) in fp32, ctx = (A, b)."""
        a, A, b = self.coefficients(s)
        return combine(a, s), (A, b)

    def read(self, state: torch.Tensor) -> tuple[torch.Tensor, Any]:
        x, ctx = self.mix_in(state)
        return self.norm(x.to(state.dtype)), ctx

    def write(self, state: torch.Tensor, y: torch.Tensor, ctx: Any) -> torch.Tensor:
        A, b = ctx
        return write_back(state, A, b, y)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.norm.reset_parameters()
        n, k = self.n, self.info.index
        with torch.no_grad():
            self.static_a.zero_()
            self.static_a[k % n] = 1.0  # sublayer k reads stream k mod n: breaks the copies' symmetry
            self.static_A.copy_(torch.eye(n, device=self.static_A.device))
            self.static_b.fill_(1.0)
            if self.dynamic:
                self.dyn_gain.zero_()
                self.dyn_proj.zero_()
                self.scale_a.fill_(self.info.cfg.hc_scale_init)
                self.scale_b.fill_(self.info.cfg.hc_scale_init)


class HCStream(TiledStream):
    """expand: n copies of the embedding; readout: RMSN_f(Σ_i S_i)."""

    def __init__(self, info: StreamInfo) -> None:
        super().__init__(info)
        self.norm = RMSNorm(info.d_model, info.eps)

    @staticmethod
    def count(d: int, cfg: RuleKnobs) -> int:
        return d

    def readout(self, state: torch.Tensor) -> torch.Tensor:
        return self.norm(state.sum(-2, dtype=acc_dtype(state))).to(state.dtype)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.norm.reset_parameters()


SPEC = RuleSpec(
    name="hc", site=HCSite, stream=HCStream, knobs=(StreamKnobs, HCKnobs),
    # the dynamic projections read the width (fan-in d, zero at start); the static coefficients are n-sized
    composition=Composition(matrices=("dyn_proj",), vectors=("norm.weight", "static_a", "static_A", "static_b",
                                                              "dyn_gain", "scale_a", "scale_b")),
    summary="n streams; x = sum_i a_i S_i, S' = A^T S + b y (Hyper-Connections; static or dynamic)",
)
