"""Learned layer scalars with an x0 path (nanochat's `resid_lambdas` / `x0_lambdas`; modded-nanogpt's `lambdas`):
before each block the state is re-mixed with the (normalised) embedding.

Legend:  b batch · t tokens · d model width · h the state (b, t, d) · x0 the normalised embedding (b, t, d) ·
l the block index
    expand    x0 = RMSN_unit(e);  h = x0                    (nanochat's norm after the embedding, no gain)
    block l   h ← λ_l h + μ_l x0, then the pre-norm sublayers as in `standard`
readout: RMSN_f(h). λ_l = `layer_scalars_resid_init` (1), μ_l = `layer_scalars_x0_init` (0.1), nanochat's start.
Under completep (docs/transfer.md) the branch multiplier m scales what each block writes, u and the x0 injection
(h ← λ_l h + m μ_l x0, then m u), never λ_l h; λ_l is a carry scalar (λ's product spans the stack).

The state is the pair (h, x0): x0 travels with it from block to block (the block passes the pair along, as it passes
AttnRes's sources), so the rule needs nothing from the model beyond the interface. The scalars belong to the
attention site of each block (the block's first sublayer); the MLP site is the plain pre-norm residual on h.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from .base import RuleKnobs, RuleSpec, Site, SiteInfo
from .composition import Composition
from .single import PreNormSite, SingleStream
from .norm import unit_rms

Pair = tuple[torch.Tensor, torch.Tensor]  # (h, x0)


@dataclass
class LayerScalarKnobs:
    layer_scalars_resid_init: float = 1.0  # λ_l at start (nanochat: 1)
    layer_scalars_x0_init: float = 0.1  # μ_l at start (nanochat: 0.1; modded-nanogpt and older nanochat: 0)


class X0Stream(SingleStream):
    """expand: the pair (h, x0), both the embedding normalised without a gain; readout: RMSN_f(h)."""

    def expand(self, e: torch.Tensor) -> Pair:
        x0 = unit_rms(e, self.info.eps)
        # h a copy, not x0 itself: a pair of one tensor twice would compile the first block to a graph of its own
        # (the cost: one (b, t, d) tensor, as `streams.tile` pays for the same reason)
        return x0.clone(), x0

    def readout(self, state: Pair) -> torch.Tensor:
        return self.norm(state[0])


class PreNormPairSite(PreNormSite):
    """The MLP's site: h + F(RMSN(h)), x0 passed along."""

    def read(self, state: Pair) -> tuple[torch.Tensor, Any]:
        return self.norm(state[0]), state[0]

    def write(self, state: Pair, y: torch.Tensor, ctx: Any) -> Pair:
        m = self.info.branch_multiplier  # completep's m_L^-alpha (1 otherwise)
        return ctx + (y if m == 1.0 else y * m), state[1]


class ScalarMixSite(PreNormPairSite):
    """The attention's site (the block's first sublayer): m = λ h + μ x0, then m + F(RMSN(m))."""

    no_decay = ("resid_lambda", "x0_lambda")

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.resid_lambda = nn.Parameter(torch.empty(1))
        self.x0_lambda = nn.Parameter(torch.empty(1))
        self.reset_parameters()

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return d + 2

    def read(self, state: Pair) -> tuple[torch.Tensor, Any]:
        h, x0 = state
        mu = self.x0_lambda if self.info.branch_multiplier == 1.0 else self.x0_lambda * self.info.branch_multiplier
        m = self.resid_lambda.to(h.dtype) * h + mu.to(h.dtype) * x0
        return self.norm(m), m

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        super().reset_parameters(generator)
        with torch.no_grad():
            self.resid_lambda.fill_(self.info.cfg.layer_scalars_resid_init)
            self.x0_lambda.fill_(self.info.cfg.layer_scalars_x0_init)


def make_site(info: SiteInfo) -> Site:
    return (ScalarMixSite if info.kind == "attn" else PreNormPairSite)(info)


def params(d: int, n_sublayers: int, cfg: RuleKnobs) -> int:
    n_attn, n_mlp = (n_sublayers + 1) // 2, n_sublayers // 2  # sublayer 2b is attention, 2b + 1 the MLP
    return X0Stream.count(d, cfg) + n_attn * ScalarMixSite.count(d, cfg) + n_mlp * PreNormPairSite.count(d, cfg)


SPEC = RuleSpec(name="layer_scalars", site=make_site, stream=X0Stream, params=params, knobs=(LayerScalarKnobs,),
                composition=Composition(branch="write", vectors=("norm.weight", "x0_lambda"),
                                        carry_scalars=("resid_lambda",)),
                summary="h <- lambda_l*h + mu_l*x0 before each block, x0 the normed embedding (nanochat scalars)")
