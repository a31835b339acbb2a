"""AttnRes: Attention Residuals, Full and Block (Kimi Team, 2026; docs/residuals.md).

Legend:  b batch · t tokens · d model width · m sources visible to a sublayer
    state     tuple (v_0, …, v_{m−1}) of (b, t, d): v_0 = e, then one entry per closed block (the sum of
              its sublayer outputs), the last entry possibly the block still being filled
    logit_j   = w_l · RMSN_key(v_j)                one zero-initialised pseudo-query w_l per sublayer
    α         = softmax_j(logit_j)                 over sources, per token, in fp32
    h_l       = Σ_j α_j v_j;  y = F(RMSN(h_l))     the sublayer keeps its own pre-norm
Full AttnRes (`attnres_block_size` = 0) is Block AttnRes with one sublayer per block. A block opens at every
sublayer index that is a multiple of the block size; the last block may be shorter.
readout: one more aggregator (own query, own key norm) over all sources, then the final RMSNorm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from rrtrain.config import ResidualConfig
from rrtrain.residuals.base import RuleSpec, Site, SiteInfo, Stream, StreamInfo, require
from rrtrain.residuals.norm import RMSNorm
from rrtrain.residuals.streams import rms_rstd, upcast

Sources = tuple[torch.Tensor, ...]


@dataclass
class AttnResKnobs:
    attnres_block_size: int = 0  # AttnRes: sublayers per block; 0 = Full AttnRes

    def check(self) -> None:
        require(self, non_negative=("attnres_block_size",))


def depth_attention(sources: Sources, query: torch.Tensor, key_gain: torch.Tensor, eps: float) -> torch.Tensor:
    """Σ_j softmax_j(w · RMSN_key(v_j)) v_j -> (b, t, d) in fp32 or wider.

    Uses w · (g ⊙ v/rms(v)) = rstd(v) · (v · (w ⊙ g)): nothing (b, t, d)-sized is kept for backward beyond
    the sources themselves, which Full AttnRes would otherwise pay O(L²) times.
    """
    u = upcast(query) * upcast(key_gain)  # (d,)
    logits = torch.stack([(v * u).sum(-1) * rms_rstd(v, eps).squeeze(-1) for v in sources], dim=-1)
    alpha = torch.softmax(logits, dim=-1)  # (b, t, m)
    out = alpha[..., 0:1] * sources[0]
    for j in range(1, len(sources)):
        out = out + alpha[..., j:j + 1] * sources[j]
    return out


class DepthQuery(nn.Module):
    """A pseudo-query and its key RMSNorm gain: the 2d parameters of one aggregator."""

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.query = nn.Parameter(torch.empty(d))
        self.key_gain = nn.Parameter(torch.empty(d))

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        with torch.no_grad():
            self.query.zero_()  # uniform weights at init: the paper saw volatility otherwise
            self.key_gain.fill_(1.0)

    def forward(self, sources: Sources) -> torch.Tensor:
        return depth_attention(sources, self.query, self.key_gain, self.eps)


def block_size(cfg: ResidualConfig) -> int:
    return cfg.attnres_block_size if cfg.attnres_block_size > 0 else 1


class AttnResSite(Site):
    """Reads a softmax mixture of earlier sources; writes by opening a new source or adding to the open one."""

    no_decay = ("agg.query", "agg.key_gain")

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.norm = RMSNorm(info.d_model, info.eps)  # the sublayer's own pre-norm
        self.agg = DepthQuery(info.d_model, info.eps)
        self.opens_block = info.index % block_size(info.cfg) == 0
        self.reset_parameters()

    @staticmethod
    def count(d: int, cfg: ResidualConfig) -> int:
        return 3 * d

    def read(self, state: Sources) -> tuple[torch.Tensor, Any]:
        return self.norm(self.agg(state).to(state[0].dtype)), None

    def write(self, state: Sources, y: torch.Tensor, ctx: Any) -> Sources:
        if self.opens_block:
            return state + (y,)
        return state[:-1] + (state[-1] + y,)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.norm.reset_parameters()
        self.agg.reset_parameters(generator)


class AttnResStream(Stream):
    """expand: the embedding is the first source; readout: the output aggregator, then the final RMSNorm."""

    no_decay = ("agg.query", "agg.key_gain")

    def __init__(self, info: StreamInfo) -> None:
        super().__init__(info)
        self.agg = DepthQuery(info.d_model, info.eps)
        self.norm = RMSNorm(info.d_model, info.eps)
        self.reset_parameters()

    @staticmethod
    def count(d: int, cfg: ResidualConfig) -> int:
        return 3 * d

    def expand(self, e: torch.Tensor) -> Sources:
        return (e,)

    def readout(self, state: Sources) -> torch.Tensor:
        return self.norm(self.agg(state)).to(state[0].dtype)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.agg.reset_parameters(generator)
        self.norm.reset_parameters()


SPEC = RuleSpec(
    name="attnres", site=AttnResSite, stream=AttnResStream, knobs=(AttnResKnobs,),
    summary="x = softmax_j(w.RMSN(v_j)) v_j over earlier outputs (Attention Residuals; Full, or Block)",
)
