"""Value residual learning (ResFormer; Zhou et al., arXiv 2410.17897): every attention layer's values mixed with the
first attention layer's, V_n ← λ1 V_n + λ2 V_1; the residual stream itself is `standard`'s.

Legend:  b batch · t tokens · d model width · h the state (b, t, d) · V_n the values of block n's attention (b, t, d),
as its QKV projection gives them, before the heads are split
    block 0        V_1 = its own values, used as they are and carried on in the state
    block n > 0    V_n ← λ1_n V_n + λ2_n V_1
    every sublayer h ← h + F(RMSN(h))
`value_residual_mix=learned` (default): λ1, λ2 learned per attention layer, both `value_residual_init` (0.5) at
start (the paper's λ = 0.5, learnable); `fixed`: both 0.5, no parameters (ResFormer's basic form; x-transformers'
`add_value_residual` with `learned_value_residual_mix=False`, `V_1.lerp(V_n, 0.5)`). readout: RMSN_f(h).

The attention site declares the `attention_inputs` capability (base.py): the block hands it the attention's QKV
projection, and it returns the q, k, v attention uses. The state is the pair (h, V_1); before block 0 the second
slot holds a view of the embedding (any tensor of that shape: block 0 never reads it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Optional

import torch
from torch import nn

from .base import KnobError, RuleKnobs, RuleSpec, Site, SiteInfo
from .composition import Composition
from .single import PreNormSite, SingleStream

Pair = tuple[torch.Tensor, torch.Tensor]  # (h, V_1)
MIXES = ("learned", "fixed")


@dataclass
class ValueResidualKnobs:
    value_residual_mix: Literal["learned", "fixed"] = "learned"  # learned: λ1, λ2 per layer; fixed: 0.5 and 0.5
    value_residual_init: float = 0.5  # λ1 and λ2 at start (learned)

    def check(self) -> None:
        if self.value_residual_mix not in MIXES:
            raise KnobError(f"model.residual.value_residual_mix must be learned or fixed, got "
                            f"{self.value_residual_mix!r}")


class PairStream(SingleStream):
    """expand: (e, a view of e in V_1's place); readout: RMSN_f(h)."""

    def expand(self, e: torch.Tensor) -> Pair:
        return e, e.view_as(e)

    def readout(self, state: Pair) -> torch.Tensor:
        return self.norm(state[0])


class PairSite(PreNormSite):
    """The MLP's site: h + F(RMSN(h)), V_1 passed along."""

    def read(self, state: Pair) -> tuple[torch.Tensor, Any]:
        return self.norm(state[0]), state[1]

    def write(self, state: Pair, y: torch.Tensor, ctx: Any) -> Pair:
        return state[0] + y, ctx


class ValueResidualSite(PairSite):
    """The attention's site: h + Attn(RMSN(h)) with the values mixed; block 0's values become V_1 (`qkv`)."""

    attention_inputs = True

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.first = info.index == 0
        self.learned = info.cfg.value_residual_mix == "learned" and not self.first
        self.lambdas = nn.Parameter(torch.empty(2)) if self.learned else None  # (λ1, λ2)
        self.no_decay = ("lambdas",) if self.learned else ()
        self.reset_parameters()

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:  # the norm; the λ are counted per layer by `params`
        return d

    def qkv(self, project: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
            x: torch.Tensor, ctx: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        q, k, v = project(x)
        if self.first:  # V_1: used as it is, and carried on
            return q, k, v, v
        v1 = ctx
        if self.lambdas is None:  # fixed: x-transformers' V_1.lerp(V_n, 0.5)
            return q, k, v1.lerp(v, 0.5), v1
        lam = self.lambdas.to(v.dtype)
        return q, k, lam[0] * v + lam[1] * v1, v1

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        super().reset_parameters(generator)
        if self.lambdas is not None:
            with torch.no_grad():
                self.lambdas.fill_(self.info.cfg.value_residual_init)


def make_site(info: SiteInfo) -> Site:
    return (ValueResidualSite if info.kind == "attn" else PairSite)(info)


def mixed_layers(n_sublayers: int) -> int:
    """The attention layers that mix (every one after the first)."""
    return max(0, (n_sublayers + 1) // 2 - 1)


def params(d: int, n_sublayers: int, cfg: RuleKnobs) -> int:
    lambdas = 2 * mixed_layers(n_sublayers) if cfg.value_residual_mix == "learned" else 0
    return PairStream.count(d, cfg) + n_sublayers * d + lambdas


def flops(d: int, n_sublayers: int, cfg: RuleKnobs) -> int:
    """The mix, per token: 3d forward (two products, a sum) and 6d backward per mixing layer (about 9d; counted 6d
    beyond the 6 per λ already counted, as the weighted sums of DenseFormer and LAuReL-PA are)."""
    return 6 * d * mixed_layers(n_sublayers)


SPEC = RuleSpec(name="value_residual", site=make_site, stream=PairStream, params=params, flops=flops,
                knobs=(ValueResidualKnobs,),
                # the stream is standard's (the multiplier on each sublayer's update u); λ1, λ2 mix values inside
                # the attention, not the state: scalars
                composition=Composition(vectors=("norm.weight", "lambdas")),
                summary="V_n <- l1*V_n + l2*V_1: every attention's values mixed with the first's (ResFormer)")
