"""Peri-LN (Kim et al., 2025, arXiv 2502.02732), the "sandwich" norm: a norm on each sublayer's input and on its
output, before the output joins the residual state.

Legend:  b batch · t tokens · d model width · h the state (b, t, d)
    h ← h + RMSN_out(F(RMSN_in(h)))        RMSN_in is the pre-norm every single-stream rule keeps
readout: RMSN_f(h) (SingleStream). Both gains start at 1: at initialisation every sublayer adds a unit-RMS
update. The peer is OLMo-core's `PeriNormTransformerBlock` (x-transformers' `sandwich_norm` is the same update);
docs/residuals.md maps the conventions.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .base import RuleKnobs, RuleSpec, SiteInfo
from .norm import RMSNorm
from .single import PreNormSite, SingleStream


class PeriNormSite(PreNormSite):
    """h + RMSN_out(u), u = F(RMSN_in(h))."""

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.out_norm = RMSNorm(info.d_model, info.eps)

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return 2 * d  # the input norm's gain and the output norm's

    def write(self, state: torch.Tensor, y: torch.Tensor, ctx: Any) -> torch.Tensor:
        return state + self.out_norm(y)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        super().reset_parameters(generator)
        self.out_norm.reset_parameters()


SPEC = RuleSpec(name="peri_ln", site=PeriNormSite, stream=SingleStream,
                summary="h + RMSN(F(RMSN(h))): a norm on each sublayer's input and output (Peri-LN, sandwich norm)")
