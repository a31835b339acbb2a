"""LayerNorm Scaling (Sun et al., 2025, "The Curse of Depth in Large Language Models", arXiv 2502.05795): each
pre-norm's output is divided by the square root of its block's 1-based depth.

Legend:  b batch · t tokens · d model width · h the state (b, t, d) · l = block index + 1 (1-based; both sublayers of
block l share it, as OLMo-core's `LayerNormScaledTransformerBlock` and the authors' code do)
    h ← h + F(RMSN(h) / √l)
init: the output projections are drawn N(0, init_std) without GPT-2's 1/√(2N) (`depth_scaled_output_init =
False`): the paper puts its scaling in place of the scaled initialisation. No parameters beyond `standard`'s.

Under mup the width rules apply and 1/√l stays; completep refuses the rule (docs/transfer.md): 1/√l is a depth
scaling of its own, per layer rather than per stack, and with m_L^-alpha on u the depth would be counted twice.

1/√l is a non-persistent 0-d buffer (rebuilt by `reset_parameters`, like the rotary tables), not a Python float:
a float that differs from block to block would compile one graph per block.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from .base import RuleSpec, SiteInfo
from .composition import Composition
from .single import PreNormSite, SingleStream


def ln_scale(index: int) -> float:
    """1/√l for sublayer `index` (0-based over the model): l = index // 2 + 1, the block's 1-based depth."""
    return 1.0 / math.sqrt(index // 2 + 1)


class LNScaledSite(PreNormSite):
    """h + F(RMSN(h) · 1/√l)."""

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.register_buffer("ln_scale", torch.empty((), dtype=torch.float32), persistent=False)  # as OLMo-core's
        self.reset_parameters()

    def read(self, state: torch.Tensor) -> tuple[torch.Tensor, Any]:
        x = self.norm(state)
        return x * self.ln_scale.to(x.dtype), None

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        super().reset_parameters(generator)
        with torch.no_grad():
            self.ln_scale.fill_(ln_scale(self.info.index))


SPEC = RuleSpec(name="ln_scaling", site=LNScaledSite, stream=SingleStream, depth_scaled_output_init=False,
                composition=Composition(vectors=("norm.weight",), depth="LayerNorm Scaling is a depth scheme of its "
                                        "own (1/sqrt(l) on each pre-norm's output in place of the depth-scaled "
                                        "init); m_L^-alpha on top would count the depth twice"),
                summary="h + F(RMSN(h)/sqrt(l)), l the 1-based block; no 1/sqrt(2N) output init (LayerNorm Scaling)")
