"""DenseFormer: Depth-Weighted Averages over every earlier block's output (Pagliardini, Mohtashami, Fleuret &
Jaggi, NeurIPS 2024, arXiv 2402.02622; the authors' code: epfml/DenseFormer, `denseformer/denseformer.py`).

Legend:  b batch · t tokens · d model width · N blocks · i the block (0-based) · k dilation · p period
    X_0        = e                                   the embedding
    X_{i+1}    = Block_i(Y_i)                        attention and MLP, each h ← h + F(RMSN(h)) (`standard`)
    Y_{i+1}    = Σ_j α_{i,j} X_j  over j ≤ i+1 with j ≡ i+1 (mod k)     the DWA after block i, when (i+1) % p = 0
    Y_{i+1}    = X_{i+1}                             no DWA after block i otherwise (period p > 1)
init: α_{i,i+1} = 1, every other α 0 (each DWA starts as the identity: the model starts as `standard`).
readout: RMSN_f(Y_N).
The DWA belongs to the block's MLP site (its last sublayer); the attention site is the plain pre-norm residual.

The state is `Dense`: the current h (b, t, d) and S = N + 1 slots (b, t, d), the outputs X_0 … X_{i+1} in the last
i + 2 and, before them, empty slots (views of e), as AttnRes keeps its sources (attnres.py): a new output enters at
the end and the oldest empty slot leaves at the front, so every block sees the same structure. Every DWA holds S
weights, one per slot (`alpha[p]` weighs slot p), and a 0/1 mask (a non-persistent buffer) of the slots it reads:
the weights of the others multiply nothing and get no gradient. So every block is the same graph under
`train.compile` (dynamo keeps parameter shapes static: a weight vector of each DWA's own length compiled one graph
per block, past the recompile limit of 8 none at all); the price is S − m unused weights per DWA over m sources
(`params` counts all S; the paper's count is N(N+3)/2 for 1x1). An eager DWA reads its m sources by index; while
compiling it multiplies all S slots by the masked weights, the same sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import torch
from torch import nn

from .base import RuleKnobs, RuleSpec, Site, SiteInfo, Stream, StreamInfo, require
from .composition import Composition
from .norm import RMSNorm
from .streams import upcast


class Dense(NamedTuple):
    """DenseFormer's residual state: `h` (the state the next sublayer reads) and `slots` (S = N + 1 tensors, the
    block outputs X_0 … X_{i+1} last, oldest first)."""

    h: torch.Tensor
    slots: tuple[torch.Tensor, ...]


@dataclass
class DenseFormerKnobs:
    denseformer_dilation: int = 1  # k: a DWA after block i reads X_j with j ≡ i+1 (mod k) only (the paper's kxp)
    denseformer_period: int = 1  # p: a DWA after every p-th block only

    def check(self) -> None:
        require(self, positive=("denseformer_dilation", "denseformer_period"))


def dwa_sources(block: int, cfg: RuleKnobs) -> tuple[int, ...]:
    """The j of the X_j the DWA after block `block` (0-based) averages, oldest first; () where there is none."""
    k, p = cfg.denseformer_dilation, cfg.denseformer_period
    if (block + 1) % p:
        return ()
    return tuple(range((block + 1) % k, block + 2, k))  # (block + 1 + k) // k of them, X_{block+1} last


def dwa_weights(n_blocks: int, cfg: RuleKnobs) -> int:
    """The α a model of `n_blocks` blocks uses: N(N+3)/2 for the 1x1 DenseFormer (the paper's count)."""
    return sum(len(dwa_sources(i, cfg)) for i in range(n_blocks))


def dwa_params(n_blocks: int, cfg: RuleKnobs) -> int:
    """The α a model holds: N + 1 per DWA (one per slot, the unused ones masked)."""
    return sum(n_blocks + 1 for i in range(n_blocks) if dwa_sources(i, cfg))


class DenseAttnSite(Site):
    """The attention's site: h + F(RMSN(h)), the slots passed along."""

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        self.norm = RMSNorm(info.d_model, info.eps)

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return d

    def read(self, state: Dense) -> tuple[torch.Tensor, Any]:
        return self.norm(state.h), None

    def write(self, state: Dense, y: torch.Tensor, ctx: Any) -> Dense:
        return Dense(state.h + y, state.slots)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.norm.reset_parameters()


class DWASite(DenseAttnSite):
    """The MLP's site: X = h + F(RMSN(h)) enters the slots as the newest output; then h = Σ_j α_j X_j (the DWA)."""

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)
        block, slots = info.index // 2, 1 + info.n_blocks
        sources = dwa_sources(block, info.cfg)
        # where each source X_j sits among the S slots after this block's output entered: X_{block+1} is the last
        self.positions = tuple(slots - (block + 2) + j for j in sources)  # read eagerly only
        self.alpha: Optional[nn.Parameter] = nn.Parameter(torch.empty(slots)) if sources else None
        self.no_decay = ("alpha",) if sources else ()  # per instance: only a site with a DWA has α
        if sources:
            self.register_buffer("mask", torch.empty(slots, dtype=torch.float32), persistent=False)
        self.reset_parameters()

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:  # the norm only: α is counted per block by `params`
        return d

    def dwa(self, slots: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Σ_j α_j X_j in fp32 or wider (type promotion keeps the bf16 outputs, not fp32 copies, for backward)."""
        assert self.alpha is not None
        alpha = upcast(self.alpha)
        if torch.compiler.is_compiling():  # all S slots, the unread ones weighted 0: one graph for every block
            weights, sources = alpha * self.mask.to(alpha.dtype), slots
        else:
            weights, sources = alpha[list(self.positions)], tuple(slots[i] for i in self.positions)
        out = weights[0] * sources[0]
        for j in range(1, len(sources)):
            out = out + weights[j] * sources[j]
        return out

    def write(self, state: Dense, y: torch.Tensor, ctx: Any) -> Dense:
        x = state.h + y  # X_{block+1}, the block's output
        slots = state.slots[1:] + (x,)
        if self.alpha is None:  # no DWA after this block (period p > 1)
            return Dense(x, slots)
        return Dense(self.dwa(slots).to(x.dtype), slots)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        super().reset_parameters(generator)
        if self.alpha is None:
            return
        with torch.no_grad():  # the identity: Y_{i+1} = X_{i+1}, the last slot
            self.alpha.zero_()
            self.alpha[-1] = 1.0
            self.mask.zero_()
            self.mask[list(self.positions)] = 1.0


class DenseStream(Stream):
    """expand: h = e and X_0 = e, the S − 1 slots before it empty (views of e); readout: RMSN_f(h)."""

    def __init__(self, info: StreamInfo) -> None:
        super().__init__(info)
        self.norm = RMSNorm(info.d_model, info.eps)
        self.slots = 1 + info.n_sublayers // 2

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return d

    def expand(self, e: torch.Tensor) -> Dense:
        """Distinct view objects (no tensor handed to the first block twice: it would compile a graph of its own)."""
        return Dense(e.view_as(e), tuple(e.view_as(e) for _ in range(self.slots - 1)) + (e,))

    def readout(self, state: Dense) -> torch.Tensor:
        return self.norm(state.h)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.norm.reset_parameters()


def make_site(info: SiteInfo) -> Site:
    return (DenseAttnSite if info.kind == "attn" else DWASite)(info)


def params(d: int, n_sublayers: int, cfg: RuleKnobs) -> int:
    return DenseStream.count(d, cfg) + n_sublayers * d + dwa_params(n_sublayers // 2, cfg)


def dwa_flops(d: int, n_sublayers: int, cfg: RuleKnobs) -> int:
    """Training FLOPs per token of the weighted sums: 2md forward and 4md backward (the gradients of the m sources
    and of α) for a DWA over m outputs; the α's own 6 per token are counted with the parameters."""
    return 6 * d * dwa_weights(n_sublayers // 2, cfg)


SPEC = RuleSpec(name="denseformer", site=make_site, stream=DenseStream, params=params, knobs=(DenseFormerKnobs,),
                flops=dwa_flops,
                # the multiplier on each sublayer's update u; a DWA's weights mix the carried states (Y = sum_j
                # alpha_j X_j): carry scalars
                composition=Composition(vectors=("norm.weight",), carry_scalars=("alpha",)),
                summary="after block i: h = sum_j alpha_ij X_j over every earlier block output (DenseFormer DWA)")
