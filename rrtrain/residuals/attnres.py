"""AttnRes: Attention Residuals, Full and Block (Kimi Team, 2026; docs/residuals.md).

Legend:  b batch · t tokens · d model width · m sources visible to a sublayer · S slots
    state     `Sources`: S slots of (b, t, d), the m sources (v_0, …, v_{m−1}) in the last m of them: v_0 = e,
              then one entry per closed block (the sum of its sublayer outputs), the last entry possibly
              the block still being filled; and a bias (S,) that is −inf on the S − m empty slots
    logit_j   = w_l · RMSN_key(v_j)                one zero-initialised pseudo-query w_l per sublayer
    α         = softmax_j(logit_j)                 over sources, per token, in fp32
    h_l       = Σ_j α_j v_j;  y = F(RMSN(h_l))     the sublayer keeps its own pre-norm
Full AttnRes (`attnres_block_size` = 0) is Block AttnRes with one sublayer per block. A block opens at every
sublayer index that is a multiple of the block size; the last block may be shorter.
readout: one more aggregator (own query, own key norm) over all sources, then the final RMSNorm.
Under completep (docs/transfer.md) each sublayer's output enters the sources as it is: the depth softmax, a convex
combination of the sources, already keeps the depth from adding up (the coordinate check's update is near flat in
the depth so, and falls as ~L^-0.57 with the multiplier); `attnres_branch_multiplier=true` makes it m·y,
m = m_L^-alpha (never the embedding source).

Why a fixed number of slots (S = 1 + the number of blocks the model opens): `train.compile` compiles each
transformer block, and a state whose length grew by one per sublayer made dynamo compile one graph per
block, past its recompile limit (8) none at all. Every block now sees the same state: a new source enters
at the end and the oldest empty slot leaves at the front (a tuple shift: no tensor is copied). The empty
slots are views of e (no memory; any finite value would do). A read while compiling aggregates over all S
slots, an empty slot's logit −inf, so its weight is exactly 0 and the output and gradients are those of the
m sources alone (tests/unit/rrtrain/residuals/test_compile_rules.py); the price is S slots' work rather than m
(about twice the aggregation's for Full AttnRes). An eager read knows m from its sublayer index and aggregates over the last
m slots only: the arithmetic of the growing tuple of sources it always was, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import torch
from torch import nn

from .base import RuleKnobs, RuleSpec, Site, SiteInfo, Stream, StreamInfo, require
from .composition import Composition
from .norm import RMSNorm
from .streams import rms_rstd, upcast


class Sources(NamedTuple):
    """AttnRes's residual state: `slots` (S tensors (b, t, d), the sources last, oldest first) and `bias`
    (S,) fp32, 0 on a source and −inf on an empty slot. Its structure is the same in every block."""

    slots: tuple[torch.Tensor, ...]
    bias: torch.Tensor


@dataclass
class AttnResKnobs:
    attnres_block_size: int = 0  # AttnRes: sublayers per block; 0 = Full AttnRes
    # completep only: each new source is m_L^-alpha * y (true) or y (false: the depth softmax alone normalises)
    attnres_branch_multiplier: bool = False

    def check(self) -> None:
        require(self, non_negative=("attnres_block_size",))


def depth_attention(sources: tuple[torch.Tensor, ...], query: torch.Tensor, key_gain: torch.Tensor, eps: float,
                    bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Σ_j softmax_j(w · RMSN_key(v_j) + bias_j) v_j -> (b, t, d) in fp32 or wider (`bias`: −inf masks a slot).

    Uses w · (g ⊙ v/rms(v)) = rstd(v) · (v · (w ⊙ g)): nothing (b, t, d)-sized is kept for backward beyond
    the sources themselves, which Full AttnRes would otherwise pay O(L²) times.
    """
    u = upcast(query) * upcast(key_gain)  # (d,)
    logits = torch.stack([(v * u).sum(-1) * rms_rstd(v, eps).squeeze(-1) for v in sources], dim=-1)
    if bias is not None:
        logits = logits + bias
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

    def forward(self, sources: tuple[torch.Tensor, ...], bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return depth_attention(sources, self.query, self.key_gain, self.eps, bias)


def block_size(cfg: RuleKnobs) -> int:
    return cfg.attnres_block_size if cfg.attnres_block_size > 0 else 1


def n_slots(n_sublayers: int, cfg: RuleKnobs) -> int:
    """S: the embedding plus one source per block opened (at every multiple of the block size)."""
    return 1 + -(-n_sublayers // block_size(cfg))


def visible_sources(index: int, cfg: RuleKnobs) -> int:
    """m: the sources sublayer `index` reads, the embedding and every block opened before it."""
    return 1 + -(-index // block_size(cfg))


def read_slots(state: Sources, m: int) -> tuple[tuple[torch.Tensor, ...], Optional[torch.Tensor]]:
    """What a read aggregates over: while compiling every slot and the bias (the same graph in every block),
    eagerly the last m slots, the sources themselves, and no bias (no work on empty slots)."""
    if torch.compiler.is_compiling():
        return state.slots, state.bias
    return state.slots[len(state.slots) - m:], None


def open_slot(state: Sources, y: torch.Tensor) -> Sources:
    """y becomes the newest source; the oldest slot, empty while the model has opened fewer than S − 1
    blocks, leaves at the front, and the bias shifts with the slots."""
    bias = torch.cat([state.bias[1:], state.bias.new_zeros(1)])
    return Sources(state.slots[1:] + (y,), bias)


class AttnResSite(Site):
    """Reads a softmax mixture of earlier sources; writes by opening a new source or adding to the open one."""

    no_decay = ("agg.query", "agg.key_gain")

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.norm = RMSNorm(info.d_model, info.eps)  # the sublayer's own pre-norm
        self.agg = DepthQuery(info.d_model, info.eps)
        self.opens_block = info.index % block_size(info.cfg) == 0
        self.visible = visible_sources(info.index, info.cfg)  # read eagerly only: no guard in a compiled block
        # completep's m_L^-alpha on what this site writes where the composition's switch is on; 1 otherwise
        self.mult = info.branch_multiplier if SPEC.composition.applies_branch(info.cfg) else 1.0
        self.reset_parameters()

    @staticmethod
    def count(d: int, cfg: RuleKnobs) -> int:
        return 3 * d

    def read(self, state: Sources) -> tuple[torch.Tensor, Any]:
        return self.norm(self.agg(*read_slots(state, self.visible)).to(state.slots[-1].dtype)), None

    def write(self, state: Sources, y: torch.Tensor, ctx: Any) -> Sources:
        if self.mult != 1.0:
            y = y * self.mult
        if self.opens_block:  # a bool per site: at most 3 block shapes whatever the depth (Full, size 2: one)
            return open_slot(state, y)
        return Sources(state.slots[:-1] + (state.slots[-1] + y,), state.bias)

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
        self.slots = n_slots(info.n_sublayers, info.cfg)
        self.reset_parameters()

    @staticmethod
    def count(d: int, cfg: RuleKnobs) -> int:
        return 3 * d

    def expand(self, e: torch.Tensor) -> Sources:
        """e is the only source; the S − 1 empty slots before it are views of it (distinct objects, so
        dynamo sees no aliasing that would change from block to block)."""
        empty = tuple(e.view_as(e) for _ in range(self.slots - 1))
        bias = torch.full((self.slots,), float("-inf"), device=e.device)
        bias[-1] = 0.0
        return Sources(empty + (e,), bias)

    def readout(self, state: Sources) -> torch.Tensor:
        return self.norm(self.agg(*read_slots(state, self.slots))).to(state.slots[-1].dtype)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.agg.reset_parameters(generator)
        self.norm.reset_parameters()


SPEC = RuleSpec(
    name="attnres", site=AttnResSite, stream=AttnResStream, knobs=(AttnResKnobs,),
    # the pseudo-query is a readout over the width (w . RMSN(v), fan-in d; zero at start): a matrix; the multiplier
    # would scale each new source (the sublayer's output), never the embedding source: the site applies it
    # ("write") where attnres_branch_multiplier is true
    composition=Composition(branch="write", branch_switch="attnres_branch_multiplier", matrices=("agg.query",),
                            vectors=("norm.weight", "agg.key_gain")),
    summary="x = softmax_j(w.RMSN(v_j)) v_j over earlier outputs (Attention Residuals; Full, or Block)",
)
