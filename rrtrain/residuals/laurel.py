"""LAuReL, the Learned Augmented Residual Layer (Menghani, Kumar & Kumar, ICML 2025, arXiv 2411.07501): the
identity path of each residual connection made learnable. Forms RW, LR (and both) and PA.

Legend:  b batch · t tokens · d model width · r rank · h the state (b, t, d) · y = F(RMSN(h)) the sublayer's update
    rw      h ← α y + β h                   α, β learned scalars, 1 at start
    lr      h ← y + h + B A h               A: d → r, B: r → d (rank r = `laurel_rank`, 0: d/32)
    rw_lr   h ← α y + β (h + B A h)
    `laurel_norm=true`: the low-rank term is RMSN_L(B A h), as Gemma 3n's `Gemma3nTextLaurelBlock` has it
    pa      h ← y + Σ_{j<k} γ_j x_{i−j}       x_{i−j} the state sublayer i − j read (x_i = h), k = `laurel_pa_window`;
            γ_0 = 1, the others 0 at start; the state carries the k − 1 earlier ones: (h, x_{i−1}, …, x_{i−k+1})
init: A ~ N(0, 1/d); B = 0 (the rule starts as `standard`), or N(0, 1/r) with `laurel_norm` (an RMSNorm of a zero
vector has a gradient of g/√eps). A and B are matmul weights (nn.Linear): weight-decayed like the branch's; α, β
and the norm gain are not. readout: RMSN_f(h).
Under completep (docs/transfer.md) the branch multiplier m scales what the site writes besides the state itself:
y, and the low-rank term (a learned function of h written into the state: with `laurel_norm` its unit RMS would
otherwise add up over the stack), h ← m y + h + m B A h; β and PA's γ weigh the carried state: carry scalars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch
from torch import nn

from .base import KnobError, RuleKnobs, RuleSpec, Site, SiteInfo, Stream, StreamInfo, require
from .composition import Composition
from .norm import RMSNorm
from .single import PreNormSite, SingleStream

FORMS = ("rw", "lr", "rw_lr", "pa")


@dataclass
class LaurelKnobs:
    laurel_form: Literal["rw", "lr", "rw_lr", "pa"] = "lr"  # rw: weights; lr: low-rank; rw_lr: both; pa: earlier states
    laurel_rank: int = 0  # r of the low-rank path; 0: d/32 (at least 1), Gemma 3n's 64 at d = 2048
    laurel_norm: bool = False  # RMSNorm on the low-rank term (Gemma 3n's post_laurel_norm)
    laurel_pa_window: int = 3  # k of the PA form: the current state and the k - 1 before it

    def check(self) -> None:
        require(self, non_negative=("laurel_rank",), positive=("laurel_pa_window",))
        if self.laurel_form not in FORMS:
            raise KnobError(f"model.residual.laurel_form must be rw, lr, rw_lr or pa, got {self.laurel_form!r}")


def laurel_rank(d: int, cfg: RuleKnobs) -> int:
    return cfg.laurel_rank if cfg.laurel_rank > 0 else max(1, d // 32)


class LaurelSite(PreNormSite):
    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        cfg, d = info.cfg, info.d_model
        self.weights = cfg.laurel_form in ("rw", "rw_lr")
        self.low_rank = cfg.laurel_form in ("lr", "rw_lr")
        self.no_decay = ("alpha", "beta") if self.weights else ()  # scalars; A and B are decayed matmul weights
        if self.weights:
            self.alpha = nn.Parameter(torch.empty(1))
            self.beta = nn.Parameter(torch.empty(1))
        if self.low_rank:
            r = laurel_rank(d, cfg)
            self.left = nn.Linear(d, r, bias=False)  # A
            self.right = nn.Linear(r, d, bias=False)  # B
            self.lr_norm = RMSNorm(d, info.eps) if cfg.laurel_norm else None
        self.reset_parameters()

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        n = d  # the pre-norm
        if cfg.laurel_form in ("rw", "rw_lr"):
            n += 2
        if cfg.laurel_form in ("lr", "rw_lr"):
            n += 2 * d * laurel_rank(d, cfg) + (d if cfg.laurel_norm else 0)
        return n

    def write(self, state: torch.Tensor, y: torch.Tensor, ctx: Any) -> torch.Tensor:
        m = self.info.branch_multiplier  # completep's m_L^-alpha (1 otherwise): on y and on the low-rank term
        carry = state
        if self.low_rank:
            z = self.right(self.left(state))
            z = self.lr_norm(z) if self.lr_norm is not None else z
            carry = state + (z if m == 1.0 else z * m)
        if m != 1.0:
            y = y * m
        if self.weights:
            return self.alpha.to(y.dtype) * y + self.beta.to(y.dtype) * carry
        return carry + y

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        super().reset_parameters(generator)
        with torch.no_grad():
            if self.weights:
                self.alpha.fill_(1.0)
                self.beta.fill_(1.0)
            if self.low_rank:
                d, r = self.left.in_features, self.left.out_features
                nn.init.normal_(self.left.weight, std=1.0 / math.sqrt(d), generator=generator)
                if self.lr_norm is not None:
                    nn.init.normal_(self.right.weight, std=1.0 / math.sqrt(r), generator=generator)
                    self.lr_norm.reset_parameters()
                else:
                    self.right.weight.zero_()


class LaurelPASite(Site):
    """LAuReL-PA: h ← y + Σ_{j<k} γ_j x_{i−j} over the state (x_i, x_{i−1}, …, x_{i−k+1}). Every site has k weights and a
    0/1 mask (a non-persistent buffer): the x_{i−j} of j > i do not exist (their slots hold views of the embedding,
    multiplied by 0), so every site computes the same graph whatever its index."""

    no_decay = ("gamma",)

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        k = info.cfg.laurel_pa_window
        self.norm = RMSNorm(info.d_model, info.eps)
        self.gamma = nn.Parameter(torch.empty(k))
        self.register_buffer("pa_mask", torch.empty(k, dtype=torch.float32), persistent=False)
        self.reset_parameters()

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return d + cfg.laurel_pa_window

    def read(self, state: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, Any]:
        return self.norm(state[0]), None

    def write(self, state: tuple[torch.Tensor, ...], y: torch.Tensor, ctx: Any) -> tuple[torch.Tensor, ...]:
        w = (self.gamma * self.pa_mask.to(self.gamma.dtype)).to(y.dtype)
        m = self.info.branch_multiplier  # completep's m_L^-alpha (1 otherwise)
        out = y if m == 1.0 else y * m
        for j, x in enumerate(state):
            out = out + w[j] * x
        return (out,) + state[:-1]

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.norm.reset_parameters()
        with torch.no_grad():
            self.gamma.zero_()
            self.gamma[0] = 1.0  # h ← y + x_i: the standard residual
            k, i = self.gamma.numel(), self.info.index
            self.pa_mask.copy_(torch.tensor([1.0 if j <= i else 0.0 for j in range(k)]))


class LaurelPAStream(Stream):
    """expand: (e, and k − 1 empty slots: distinct views of e, multiplied by 0); readout: RMSN_f(h)."""

    def __init__(self, info: StreamInfo) -> None:
        super().__init__(info)
        self.norm = RMSNorm(info.d_model, info.eps)
        self.window = info.cfg.laurel_pa_window

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return d

    def expand(self, e: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (e,) + tuple(e.view_as(e) for _ in range(self.window - 1))

    def readout(self, state: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.norm(state[0])

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.norm.reset_parameters()


def make_site(info: SiteInfo) -> Site:
    return (LaurelPASite if info.cfg.laurel_form == "pa" else LaurelSite)(info)


def make_stream(info: StreamInfo) -> Stream:
    return (LaurelPAStream if info.cfg.laurel_form == "pa" else SingleStream)(info)


def params(d: int, n_sublayers: int, cfg: RuleKnobs) -> int:
    if cfg.laurel_form == "pa":
        return LaurelPAStream.count(d, cfg) + n_sublayers * LaurelPASite.count(d, cfg)
    return SingleStream.count(d, cfg) + n_sublayers * LaurelSite.count(d, cfg)


def flops(d: int, n_sublayers: int, cfg: RuleKnobs) -> int:
    """PA's weighted sum over k states, 2kd forward and 4kd backward per sublayer per token (beyond 6 per weight)."""
    return 6 * d * cfg.laurel_pa_window * n_sublayers if cfg.laurel_form == "pa" else 0


# every form in one declaration (a pattern that names no parameter of a form is harmless): A reads the width (fan-in
# d, drawn with 1/d variance); B's fan-in is the rank, d/32 by default, so it grows with the width too (a fixed
# laurel_rank makes it an input-like weight, whose LR / m_w is then conservative); B starts at 0 or with 1/r variance
COMPOSITION = Composition(branch="write", matrices=("left.weight", "right.weight"),
                          vectors=("norm.weight", "lr_norm.weight", "alpha"), carry_scalars=("beta", "gamma"))

SPEC = RuleSpec(name="laurel", site=make_site, stream=make_stream, params=params, knobs=(LaurelKnobs,), flops=flops,
                composition=COMPOSITION,
                summary="h + F(RMSN(h)) + B A h (LAuReL-LR, rank laurel_rank); rw: alpha*u + beta*h; pa: u + sum_j g_j x_(i-j)")
