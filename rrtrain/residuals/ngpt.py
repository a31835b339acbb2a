"""nGPT, the normalized Transformer (Loshchilov, Hsieh, Sun & Ginsburg, ICLR 2025, arXiv 2410.01131; NVIDIA/ngpt
`model.py`): the state and every matrix's rows (or columns) live on the unit sphere, and each sublayer moves the
state part of the way towards its normalised output.

Legend:  b batch · t tokens · d model width · hd head width · h the state (b, t, d), |h| = 1 · N(x) = x / |x| over
the last dimension (per head for q and k)
    expand      h = N(e)                                  (e the token embedding, plus the learned position's)
    attention   q, k, v = W_qkv h (no pre-norm);  q ← s_qk ⊙ N(q),  k ← s_qk ⊙ N(k);  softmax scale √hd
    MLP         y = W_2 GELU(s_u √d · W_1 h)              (no pre-norm)
    each        h ← N(N(h) + |α| ⊙ (N(y) − N(h)))         α (d) learned, one per sublayer
    readout     z = s_z h                                 (no final norm: the tied head gives s_z · E h)
    after each optimizer step: the rows of W_qkv, W_1 and the embedding and the columns of both output projections
    set back to unit norm (`RuleSpec.after_step`; the engine applies it, also to FSDP2 shards)
NVIDIA's scaled parameters: each of α, s_qk, s_u, s_z is stored as θ, starts at `scaling` and is used as
θ · init / scaling (α: 0.05, 1/√d; s_qk: 1, 1/√d; s_u: 1, 1; s_z: 1, 1/√d), so Adam's steps on it are
init/scaling times larger. s_u and s_z are one scalar each here (NVIDIA: one per hidden unit, one per token of
the vocabulary): a rule's parameters are counted from the width alone, and the tied head is the model's.

The attention site declares `attention_inputs` (base.py) to normalise q and k; the MLP's `s_u √d`, one scalar, is
applied to the MLP's input (its first layer is linear without a bias). Every matrix is normalised after the model's
own draw, in `reset_parameters`, so the model starts on the sphere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .base import RuleKnobs, RuleSpec, Site, SiteInfo, Stream, StreamInfo, require
from .fixup import _BranchSite as BranchSite  # keeps its branch without owning it; reads h with no norm
from .fixup import branch_layers
from .streams import acc_dtype

Edit = tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]  # a parameter and what it becomes after a step


@dataclass
class NGPTKnobs:
    ngpt_alpha_init: float = 0.05  # |α| at start, both sublayers (NVIDIA's 0.05; the paper suggests ~1/layers)
    ngpt_sz_init: float = 1.0  # s_z at start: the logits are s_z times cosines

    def check(self) -> None:
        require(self, positive=("ngpt_alpha_init", "ngpt_sz_init"))


def unit(x: torch.Tensor) -> torch.Tensor:
    """N(x) over the last dimension, in at least fp32, back in x's dtype."""
    return F.normalize(x.to(acc_dtype(x)), dim=-1).to(x.dtype)


def unit_rows(w: torch.Tensor) -> torch.Tensor:
    """Each row of a matrix to unit norm (a reduction over dim 1: local to an FSDP2 shard of rows)."""
    return w / torch.linalg.vector_norm(w, dim=1, keepdim=True)


def unit_columns(w: torch.Tensor) -> torch.Tensor:
    """Each column to unit norm: over dim 0, which FSDP2 shards; on a DTensor the norm is reduced over the ranks."""
    return w / torch.linalg.vector_norm(w, dim=0, keepdim=True)


class NGPTSite(BranchSite):
    """h ← N(N(h) + |α| ⊙ (N(y) − N(h))); the branch reads h as it is (no norm: `read` is Fixup's). The
    attention's and the MLP's sites add their own scalings (`NGPTAttnSite`, `NGPTMLPSite`)."""

    no_decay = ("alpha",)

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.base = 1.0 / math.sqrt(info.d_model)  # NVIDIA's base_scale, the `scaling` of α
        self.alpha = nn.Parameter(torch.empty(info.d_model))

    def write(self, state: torch.Tensor, y: torch.Tensor, ctx: Any) -> torch.Tensor:
        acc = acc_dtype(state)  # the state's step in fp32 or wider: it is small next to |h| = 1
        alpha = (self.alpha * (self.info.cfg.ngpt_alpha_init / self.base)).abs().to(acc)
        a = F.normalize(state.to(acc), dim=-1)
        b = F.normalize(y, dim=-1).to(acc)  # in y's dtype, as NVIDIA's (its norm accumulates in fp32)
        return F.normalize(a + alpha * (b - a), dim=-1).to(state.dtype)

    def sphere(self) -> list[Edit]:
        """The branch's matrices and how each goes back on the sphere: input layers by rows, output by columns."""
        if not self._branch:
            return []
        first, last = branch_layers(self._branch[0], self.info.kind)
        return [(first.weight, unit_rows), (last.weight, unit_columns)]

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """α at `scaling`; the branch (drawn by the model already) onto the sphere."""
        with torch.no_grad():
            self.alpha.fill_(self.base)
            for weight, edit in self.sphere():
                weight.copy_(edit(weight))


class NGPTAttnSite(NGPTSite):
    """q, k normalised per head and scaled by s_qk; the softmax scale √hd (folded into q)."""

    attention_inputs = True
    no_decay = ("alpha", "sqk")

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.sqk = nn.Parameter(torch.empty(info.d_model))
        self.reset_parameters()

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return 2 * d

    def qkv(self, project: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
            x: torch.Tensor, ctx: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        q, k, v = project(x)
        attn = self._branch[0]
        heads = attn.n_heads
        hd = x.shape[-1] // heads
        scale = attn.scale if attn.scale is not None else hd ** -0.5  # what the attention multiplies q·k by
        sqk = (self.sqk / self.base).to(acc_dtype(q)).view(heads, hd)  # s_qk = θ · 1 / (1/√d)

        def per_head(z: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
            # in z's own dtype, as NVIDIA's (bf16 there); the norm itself accumulates in fp32
            return (F.normalize(z.view(*z.shape[:-1], heads, hd), dim=-1) * gain).to(z.dtype).view_as(z)

        return per_head(q, sqk * (math.sqrt(hd) / scale)), per_head(k, sqk), v, ctx

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        super().reset_parameters(generator)
        with torch.no_grad():
            self.sqk.fill_(self.base)


class NGPTMLPSite(NGPTSite):
    """The MLP's hidden layer times s_u √d: as s_u is one scalar and the first layer has no bias, the MLP reads
    s_u √d · h (W_1 (c h) = c W_1 h), so the branch itself is left alone."""

    no_decay = ("alpha", "su")

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.su = nn.Parameter(torch.empty(1))
        self.reset_parameters()

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return d + 1

    def read(self, state: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return state * (self.su * math.sqrt(self.info.d_model)).to(state.dtype), None  # s_u = θ · 1 / 1, times √d

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        super().reset_parameters(generator)
        with torch.no_grad():
            self.su.fill_(1.0)


class NGPTStream(Stream):
    """expand: N(e); readout: s_z h. The token embedding's rows live on the sphere too (they are the tied head's)."""

    no_decay = ("sz",)

    def __init__(self, info: StreamInfo) -> None:
        super().__init__(info)
        self.base = 1.0 / math.sqrt(info.d_model)
        self.sz = nn.Parameter(torch.empty(1))
        self._embedding: tuple[nn.Embedding, ...] = ()
        self.reset_parameters()

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return 1

    def attach(self, tok_emb: nn.Embedding, pos_emb: Optional[nn.Embedding]) -> None:
        self._embedding = (tok_emb,)  # learned positions stay as drawn: their sum with the token's is normalised

    def expand(self, e: torch.Tensor) -> torch.Tensor:
        return unit(e)

    def readout(self, state: torch.Tensor) -> torch.Tensor:
        return state * (self.sz * (self.info.cfg.ngpt_sz_init / self.base)).to(state.dtype)

    def sphere(self) -> list[Edit]:
        return [(table.weight, unit_rows) for table in self._embedding]

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        with torch.no_grad():
            self.sz.fill_(self.base)
            for weight, edit in self.sphere():
                weight.copy_(edit(weight))


def make_site(info: SiteInfo) -> Site:
    return (NGPTAttnSite if info.kind == "attn" else NGPTMLPSite)(info)


def params(d: int, n_sublayers: int, cfg: RuleKnobs) -> int:
    n_attn, n_mlp = (n_sublayers + 1) // 2, n_sublayers // 2  # sublayer 2b is attention, 2b + 1 the MLP
    return NGPTStream.count(d, cfg) + n_attn * NGPTAttnSite.count(d, cfg) + n_mlp * NGPTMLPSite.count(d, cfg)


def after_step(model: nn.Module) -> Iterable[Edit]:
    """Every matrix nGPT keeps on the sphere, found through the rule's own sites and stream (the engine applies
    them after each optimizer step that changed the weights)."""
    return [edit for m in model.modules() if isinstance(m, (NGPTSite, NGPTStream)) for edit in m.sphere()]


# FLOPs: nothing beyond the planner's 6 per parameter per token (`RuleSpec.flops` unset): the normalisations and
# scalings are elementwise, uncounted as every rule's norms are; the renormalisation runs once per step, not per token
SPEC = RuleSpec(name="ngpt", site=make_site, stream=NGPTStream, params=params, knobs=(NGPTKnobs,),
                after_step=after_step,
                summary="h <- N(N(h) + |alpha|*(N(F(h)) - N(h))), weights on the unit sphere (nGPT)")
