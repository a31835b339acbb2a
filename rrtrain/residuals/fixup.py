"""Fixup and T-Fixup: no normalisation inside the residual branches; the initialisation alone keeps a deep
stack trainable. docs/residuals.md says how each paper was mapped onto this block and what they leave open.

Legend:  b batch · t tokens · d width · N blocks · L = 2N sublayers · h the state (b, t, d) · k summed
embedding tables (tokens, and learned positions)

fixup (Zhang, Dauphin & Ma, ICLR 2019), m = 2 weight layers per branch, `model.residual.fixup_variant=fixup`:
    attention   y = s · W_o(attn(W_qkv(h + b_in)) + b_proj)
    MLP         y = s · W_2(gelu(W_1(h + b_in) + b_act) + b_proj)
    h ← h + y
    init: W_o = W_2 = 0;  W_qkv (q, k, v as d×d each), W_1 Xavier-uniform × L^(−1/(2m−2)) = L^(−1/2);
          every b = 0, s = 1;  embedding tables N(0, 1/(k·d))
tfixup (Huang, Perez, Ba & Volkovs, ICML 2020), restated for a decoder-only stack, `fixup_variant=tfixup`:
    h ← h + F(h), no norm and no scalars
    init: q, k, v, W_o, W_1, W_2 Xavier-uniform; v, W_o, W_1, W_2 × a;  embedding tables N(0, a²/(k·d));
          a = (6N)^(−1/4)
both: h_0 = √d · (token + position embedding) (unit scale for fixup, a for tfixup); no final norm, as in both
papers' code: the tied LM head reads h_L + b_f (fixup; b_f a scalar, 0 at start) or h_L (tfixup);
`fixup_final_norm=true` reads RMSN_f(h_L) instead (the pre-norm rules' readout, which lets the state grow
unchecked under Adam at depth: docs/depth.md).

The block does not know any of this: b_proj and b_act sit between the branch's own layers, so the site
adds them with hooks on the branch's Linear layers, and re-initialises those layers, through `attach`;
the stream re-draws the embedding tables it is attached to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Optional

import torch
from torch import nn

from .base import RuleKnobs, RuleSpec, Site, SiteInfo, Stream, StreamInfo
from .composition import Composition
from .norm import RMSNorm


@dataclass
class FixupKnobs:
    fixup_variant: Literal["fixup", "tfixup"] = "fixup"  # fixup: Fixup (ICLR 2019); tfixup: T-Fixup (ICML 2020)
    # False: the papers' readout, h_L straight to the tied head (Fixup: plus a scalar bias); True: RMSN_f(h_L),
    # which hides the state's scale from the loss, so nothing checks its growth (docs/depth.md)
    fixup_final_norm: bool = False


def fixup_scale(n_sublayers: int) -> float:
    """Fixup's factor on a branch's non-final weight layers: L^(−1/(2m−2)) with m = 2 layers per branch."""
    return n_sublayers ** -0.5


def tfixup_scale(n_blocks: int) -> float:
    """T-Fixup's a for a decoder-only stack: 2N sublayers × 3 equal terms a⁴ summing to 1 gives (6N)^(−1/4)."""
    return (6.0 * n_blocks) ** -0.25


def branch_layers(branch: nn.Module, kind: str) -> tuple[nn.Linear, nn.Linear]:
    """The first and the last weight layer of an attention ("attn") or MLP ("mlp") branch."""
    return (branch.qkv, branch.proj) if kind == "attn" else (branch.fc, branch.proj)


def xavier_branch(branch: nn.Module, kind: str, d: int,
                  generator: Optional[torch.Generator] = None) -> tuple[nn.Linear, nn.Linear]:
    """Both papers' "standard" start: Xavier-uniform on every matrix of the branch (q, k, v as d×d each)."""
    first, last = branch_layers(branch, kind)
    blocks = first.weight.split(d) if kind == "attn" else (first.weight,)
    for w in (*blocks, last.weight):
        nn.init.xavier_uniform_(w, generator=generator)
    return first, last


class _BranchSite(Site):
    """A site that keeps a reference to its branch without owning it (the block does)."""

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self._branch: tuple[nn.Module, ...] = ()  # a tuple, so nn.Module does not register it as a child
        self._hooks: list[Any] = []

    def attach(self, branch: nn.Module) -> None:
        for handle in self._hooks:
            handle.remove()
        self._branch, self._hooks = (branch,), []

    def read(self, state: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return state, None  # no norm inside the branch

    def write(self, state: torch.Tensor, y: torch.Tensor, ctx: Any) -> torch.Tensor:
        return state + y


class FixupSite(_BranchSite):
    """Scalar biases before each weight layer (and the MLP's activation), a scalar multiplier on the output."""

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.bias_in = nn.Parameter(torch.zeros(1))
        if info.kind == "mlp":
            self.bias_act = nn.Parameter(torch.zeros(1))
        self.bias_proj = nn.Parameter(torch.zeros(1))
        self.scale = nn.Parameter(torch.ones(1))

    @staticmethod
    def count(kind: str) -> int:
        return 4 if kind == "mlp" else 3

    def attach(self, branch: nn.Module) -> None:
        super().attach(branch)
        first, last = branch_layers(branch, self.info.kind)
        self._hooks.append(last.register_forward_pre_hook(self._add_bias_proj))
        if self.info.kind == "mlp":
            self._hooks.append(first.register_forward_hook(self._add_bias_act))

    def _add_bias_proj(self, module: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return (args[0] + self.bias_proj.to(args[0].dtype),)

    def _add_bias_act(self, module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        return out + self.bias_act.to(out.dtype)

    def read(self, state: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return state + self.bias_in.to(state.dtype), None

    def write(self, state: torch.Tensor, y: torch.Tensor, ctx: Any) -> torch.Tensor:
        return state + self.scale.to(y.dtype) * y

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """Scalars to 0 / 1; the attached branch re-drawn to Fixup's start (after the model's own draw)."""
        with torch.no_grad():
            for p in (self.bias_in, self.bias_proj, getattr(self, "bias_act", None)):
                if p is not None:
                    p.zero_()
            self.scale.fill_(1.0)
            if self._branch:
                first, last = xavier_branch(self._branch[0], self.info.kind, self.info.d_model, generator)
                first.weight.mul_(fixup_scale(self.info.n_sublayers))
                last.weight.zero_()


class TFixupSite(_BranchSite):
    """No parameters of its own: T-Fixup is an initialisation of the branch."""

    @staticmethod
    def count(kind: str) -> int:
        return 0

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """The attached branch re-drawn to T-Fixup's start (after the model's own draw)."""
        if not self._branch:
            return
        a, d = tfixup_scale(self.info.n_blocks), self.info.d_model
        with torch.no_grad():
            first, last = xavier_branch(self._branch[0], self.info.kind, d, generator)
            if self.info.kind == "attn":
                first.weight[2 * d:].mul_(a)  # v only: q and k set the attention pattern, not the scale
            else:
                first.weight.mul_(a)
            last.weight.mul_(a)


class NormFreeStream(Stream):
    """Unit-scale input for branches without a norm: x = √d · e, as both papers' code scales its embeddings;
    and no norm at the end either, as in both papers' code.

    The embedding tables are re-drawn N(0, g² / (k·d)) (k tables summed: tokens, and learned positions), so
    x has per-coordinate standard deviation g: 1 for Fixup, T-Fixup's a for T-Fixup. The tied head sees the
    table itself (entries ~ 1/√(k·d)), not the √d-scaled input. The readout is h_L itself (Fixup adds a scalar
    bias, its rule 3 for the head's linear layer): the logits grow with the state, so the loss itself holds the
    state's scale in check. With `fixup_final_norm` the readout is RMSN_f(h_L), as for the pre-norm rules.
    """

    def __init__(self, info: StreamInfo) -> None:
        super().__init__(info)
        self._embeddings: tuple[nn.Embedding, ...] = ()
        self.norm: Optional[RMSNorm] = RMSNorm(info.d_model, info.eps) if info.cfg.fixup_final_norm else None
        self.bias: Optional[nn.Parameter] = None
        if not info.cfg.fixup_final_norm and info.cfg.fixup_variant == "fixup":
            self.bias = nn.Parameter(torch.zeros(1))

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        if cfg.fixup_final_norm:
            return d
        return 1 if cfg.fixup_variant == "fixup" else 0

    def readout(self, state: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            return self.norm(state)
        return state if self.bias is None else state + self.bias.to(state.dtype)

    def attach(self, tok_emb: nn.Embedding, pos_emb: Optional[nn.Embedding]) -> None:
        self._embeddings = tuple(e for e in (tok_emb, pos_emb) if e is not None)

    def input_std(self) -> float:
        if self.info.cfg.fixup_variant == "tfixup":
            return tfixup_scale(self.info.n_sublayers // 2)
        return 1.0

    def expand(self, e: torch.Tensor) -> torch.Tensor:
        return e * math.sqrt(self.info.d_model)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        if self.norm is not None:
            self.norm.reset_parameters()
        if self.bias is not None:
            with torch.no_grad():
                self.bias.zero_()
        if not self._embeddings:
            return
        d, k = self.info.d_model, len(self._embeddings)
        with torch.no_grad():
            for table in self._embeddings:
                nn.init.normal_(table.weight, std=self.input_std() / math.sqrt(k * d), generator=generator)


def make_site(info: SiteInfo) -> Site:
    return (FixupSite if info.cfg.fixup_variant == "fixup" else TFixupSite)(info)


def params(d: int, n_sublayers: int, cfg: RuleKnobs) -> int:
    site = FixupSite if cfg.fixup_variant == "fixup" else TFixupSite
    n_attn, n_mlp = (n_sublayers + 1) // 2, n_sublayers // 2  # sublayer 2b is attention, 2b + 1 the MLP
    return NormFreeStream.count(d, cfg) + n_attn * site.count("attn") + n_mlp * site.count("mlp")


SPEC = RuleSpec(
    name="fixup", site=make_site, stream=NormFreeStream, params=params, knobs=(FixupKnobs,),
    composition=Composition(vectors=("bias_in", "bias_act", "bias_proj", "scale", "bias", "norm.weight"),
                            depth="Fixup is a depth scheme of its own (branch init x L^-1/2, last layer zero)"),
    summary="h + s*F(h + b), no branch norm, last layer 0, others x L^-1/2 (Fixup); tfixup: T-Fixup scaling",
)
