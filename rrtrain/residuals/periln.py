"""Peri-LN (Kim et al., 2025, arXiv 2502.02732), the "sandwich" norm: a norm on each sublayer's input and on its
output, before the output joins the residual state.

Legend:  b batch · t tokens · d model width · h the state (b, t, d)
    h ← h + RMSN_out(F(RMSN_in(h)))        RMSN_in is the pre-norm every single-stream rule keeps
readout: RMSN_f(h) (SingleStream). Both gains start at 1: at initialisation every sublayer adds a unit-RMS
update. The peer is OLMo-core's `PeriNormTransformerBlock` (x-transformers' `sandwich_norm` is the same update);
docs/residuals.md maps the conventions. Under completep (docs/transfer.md) the branch multiplier m goes after the
output norm, which would undo it on u: h ← h + m · RMSN_out(u).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .base import RuleKnobs, RuleSpec, SiteInfo
from .composition import Composition
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
        m = self.info.branch_multiplier  # completep's m_L^-alpha (1 otherwise): after the norm, which undoes it on u
        return state + (self.out_norm(y) if m == 1.0 else self.out_norm(y) * m)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        super().reset_parameters(generator)
        self.out_norm.reset_parameters()


SPEC = RuleSpec(name="peri_ln", site=PeriNormSite, stream=SingleStream,
                composition=Composition(branch="write", vectors=("norm.weight", "out_norm.weight")),
                summary="h + RMSN(F(RMSN(h))): a norm on each sublayer's input and output (Peri-LN, sandwich norm)")
