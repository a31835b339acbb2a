"""Single-stream rules: the state is one residual vector per token, h of shape (B, T, D).

All of them keep the pre-norm inside `read` (u = F(RMSNorm(h))), and differ only in `write`:

    standard        h + u
    review          h + r * u,          r = sigma(W [RMSN(h); RMSN(u)] + b)   (Eq. 1)
    review_convex   (1 - r) * h + r * u, same r                                (the form that fails at depth)
    highway         h + r * u,          r = sigma(W RMSN(h) + b)               (parameter-matched baseline)
    highway_convex  (1 - r) * h + r * u, same r, carry-favouring bias          (classic Highway network)
    rezero          h + alpha * u,      alpha = 0 at start
    layerscale      h + lambda * u,     per-channel lambda, CaiT's depth-dependent start
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from .base import RuleKnobs, RuleSpec, Site, SiteInfo, Stream, StreamInfo, require
from .composition import Composition
from .gates import Gate
from .norm import RMSNorm


@dataclass
class GateKnobs:
    """The learned gate of review, review_convex, highway and highway_convex."""

    gate_rank: int = 0  # 0: full-rank gate W (Eq. 1 of the paper); k > 0: low-rank in -> k -> d
    gate_bias: Optional[float] = None  # gate bias at start; None = the rule's default (highway_convex: -2)

    def check(self) -> None:
        require(self, non_negative=("gate_rank",))


@dataclass
class ConvexKnobs:
    """review_convex and highway_convex under completep: whether the update also takes the branch multiplier m_L^-alpha
    (true) or the depth-aware carry gate alone scales depth (false: the gate's start already shrinks r as 1/L,
    so the multiplier on top counts depth twice; docs/transfer.md has both measured)."""

    convex_branch_multiplier: bool = False


@dataclass
class LayerScaleKnobs:
    layerscale_init: Optional[float] = None  # None = CaiT's depth rule (0.1 / 1e-5 / 1e-6)


class SingleStream(Stream):
    """expand: the embedding is the state; readout: the final RMSNorm."""

    def __init__(self, info: StreamInfo) -> None:
        super().__init__(info)
        self.norm = RMSNorm(info.d_model, info.eps)

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return d

    def expand(self, e: torch.Tensor) -> torch.Tensor:
        return e

    def readout(self, state: torch.Tensor) -> torch.Tensor:
        return self.norm(state)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.norm.reset_parameters()


class PreNormSite(Site):
    """h + u with u = F(RMSNorm(h)): the standard pre-norm residual, and the base of the others."""

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.norm = RMSNorm(info.d_model, info.eps)

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return d

    def read(self, state: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return self.norm(state), None

    def write(self, state: torch.Tensor, y: torch.Tensor, ctx: Any) -> torch.Tensor:
        return state + y

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.norm.reset_parameters()


class GatedSite(PreNormSite):
    """h + r*u (additive) or (1 - r)*h + r*u (convex); r from the state, and from the update if `reads_update`."""

    reads_update = True
    convex = False
    default_bias = 0.0

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        d = info.d_model
        self.gate_norm_h = RMSNorm(d, info.eps)
        self.gate_norm_u = RMSNorm(d, info.eps) if self.reads_update else None
        bias = info.cfg.gate_bias if info.cfg.gate_bias is not None else self.default_bias
        self.gate = Gate(2 * d if self.reads_update else d, d, info.cfg.gate_rank, bias)

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        inputs = 2 * d if cls.reads_update else d
        norms = d * (3 if cls.reads_update else 2)
        return norms + Gate.count(inputs, d, cfg.gate_rank)

    def write(self, state: torch.Tensor, y: torch.Tensor, ctx: Any) -> torch.Tensor:
        # r = sigma(W [RMSN_h(h); RMSN_u(u)] + b); the gate folds the norms' gains into W (see Gate)
        root_d = math.sqrt(state.shape[-1])
        gains = [self.gate_norm_h.gain() * root_d]
        if self.gate_norm_u is not None:
            gains.append(self.gate_norm_u.gain() * root_d)
        out, r = self.gate(state, y, gains, self.gate_norm_h.eps, self.convex)  # (B, T, D) each
        self._record_gate(r)
        return out

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        super().reset_parameters(generator)
        self.gate_norm_h.reset_parameters()
        if self.gate_norm_u is not None:
            self.gate_norm_u.reset_parameters()
        self.gate.reset_parameters(generator)


class ReviewSite(GatedSite):
    reads_update, convex = True, False


class ReviewConvexSite(GatedSite):
    reads_update, convex = True, True


class HighwaySite(GatedSite):
    reads_update, convex = False, False


class HighwayConvexSite(GatedSite):
    reads_update, convex, default_bias = False, True, -2.0


class ReZeroSite(PreNormSite):
    """h + alpha * u with one scalar alpha per sublayer, alpha = 0 at start: the network starts as the identity."""

    no_decay = ("alpha",)

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.alpha = nn.Parameter(torch.empty(1))
        self.reset_parameters()

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return d + 1

    def write(self, state: torch.Tensor, y: torch.Tensor, ctx: Any) -> torch.Tensor:
        return state + self.alpha.to(y.dtype) * y

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        super().reset_parameters(generator)
        with torch.no_grad():
            self.alpha.zero_()


def layerscale_init(n_blocks: int) -> float:
    """CaiT's start value by depth (in blocks): 0.1 up to 18, 1e-5 up to 24, 1e-6 deeper."""
    if n_blocks <= 18:
        return 0.1
    if n_blocks <= 24:
        return 1e-5
    return 1e-6


class LayerScaleSite(PreNormSite):
    """h + lambda * u with a per-channel lambda, small at start."""

    no_decay = ("scale",)

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.scale = nn.Parameter(torch.empty(info.d_model))
        self.reset_parameters()

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return 2 * d

    def write(self, state: torch.Tensor, y: torch.Tensor, ctx: Any) -> torch.Tensor:
        return state + self.scale.to(y.dtype) * y

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        super().reset_parameters(generator)
        init = self.info.cfg.layerscale_init
        with torch.no_grad():
            self.scale.fill_(init if init is not None else layerscale_init(self.info.n_blocks))


# how each composes with mup / completep (rrtrain/residuals/composition.py): the multiplier on the update u; the
# gate's d -> d (or 2d -> d, 2d -> k) weight is a hidden matrix, its k -> d factor (fan-in k) a vector, its bias
# too, and a convex gate's bias the carry gate
PLAIN = Composition(vectors=("norm.weight",))
GATE = dict(matrices=("gate.proj.weight", "gate.down.weight"), scaled_init=("gate.down.weight",),
            vectors=("norm.weight", "gate_norm_h.weight", "gate_norm_u.weight", "gate.bias", "gate.up.weight"))
GATED = Composition(**GATE)
CONVEX = Composition(**GATE, carry_gates=("gate.bias",), branch_switch="convex_branch_multiplier")


def _single(name: str, site: type[PreNormSite], summary: str, knobs: tuple[type, ...] = (), **kw: Any) -> RuleSpec:
    return RuleSpec(name=name, site=site, stream=SingleStream, summary=summary, knobs=knobs, **kw)


SPECS = (
    _single("standard", PreNormSite, "h + u (pre-norm residual)", composition=PLAIN),
    _single("review", ReviewSite, "h + r*u, r = sigma(W[RMSN(h); RMSN(u)] + b) (Review Residuals, Eq. 1)",
            (GateKnobs,), gated=True, composition=GATED),
    _single("review_convex", ReviewConvexSite, "(1-r)*h + r*u with Review's gate (fails beyond ~20 layers)",
            (GateKnobs, ConvexKnobs), gated=True, convex=True, composition=CONVEX),
    _single("highway", HighwaySite, "h + r*u, r = sigma(W RMSN(h) + b) (state-only gate, additive)",
            (GateKnobs,), gated=True, composition=GATED),
    _single("highway_convex", HighwayConvexSite,
            "(1-r)*h + r*u, r = sigma(W RMSN(h) + b), carry bias (classic Highway)", (GateKnobs, ConvexKnobs),
            gated=True, convex=True, composition=CONVEX),
    _single("rezero", ReZeroSite, "h + alpha*u, scalar alpha = 0 at start (ReZero)",
            composition=Composition(vectors=("norm.weight", "alpha"))),
    _single("layerscale", LayerScaleSite, "h + lambda*u, per-channel lambda, CaiT depth init (LayerScale)",
            (LayerScaleKnobs,), composition=Composition(vectors=("norm.weight", "scale"))),
)
