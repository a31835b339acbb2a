"""DeepNorm: post-norm with an up-weighted residual (Wang et al., DeepNet, 2022).

Legend:  b batch · t tokens · d model width · N blocks (decoder-only)
    h ← RMSN(α h + F(h)),   α = (2N)^{1/4}       the sublayer reads h directly: no pre-norm
    init: V rows of qkv, the MLP's fc and both output projections scaled by β = (8N)^{−1/4}
          (the model applies `branch_init_gain`; q/k keep gain 1)
readout: the state itself. Every write ends in an RMSNorm, so the last one is the final norm.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .base import RuleKnobs, RuleSpec, Site, SiteInfo, Stream
from .composition import Composition
from .norm import RMSNorm
from .streams import upcast


def deepnorm_alpha(n_blocks: int) -> float:
    """Residual up-weighting for a decoder-only stack of N blocks."""
    return (2.0 * n_blocks) ** 0.25


def deepnorm_beta(n_blocks: int) -> float:
    """Init down-scaling of the value, output and MLP weights (torchscale divides by (8N)^{1/4})."""
    return (8.0 * n_blocks) ** -0.25


class DeepNormSite(Site):
    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.alpha = deepnorm_alpha(info.n_blocks)
        self.norm = RMSNorm(info.d_model, info.eps)  # the post-norm

    @staticmethod
    def count(d: int, cfg: RuleKnobs) -> int:
        return d

    def read(self, state: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return state, None

    def write(self, state: torch.Tensor, y: torch.Tensor, ctx: Any) -> torch.Tensor:
        return self.norm(self.alpha * upcast(state) + upcast(y)).to(state.dtype)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.norm.reset_parameters()


class PostNormStream(Stream):
    """expand: the embedding; readout: the state as it is (already normalised by the last write)."""

    @staticmethod
    def count(d: int, cfg: RuleKnobs) -> int:
        return 0

    def expand(self, e: torch.Tensor) -> torch.Tensor:
        return e

    def readout(self, state: torch.Tensor) -> torch.Tensor:
        return state

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        pass


SPEC = RuleSpec(
    name="deepnorm", site=DeepNormSite, stream=PostNormStream, post_norm=True,
    branch_init_gain=deepnorm_beta,
    composition=Composition(vectors=("norm.weight",), depth="DeepNorm is a depth scheme of its own (alpha = "
                            "(2N)^1/4 on the state, beta = (8N)^-1/4 on the branch init)"),
    summary="h <- RMSN(alpha*h + F(h)), alpha = (2N)^1/4, branch init x (8N)^-1/4 (DeepNorm, post-norm)",
)
