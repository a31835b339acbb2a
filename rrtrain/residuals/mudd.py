"""MUDDFormer: multiway dynamic dense connections (Xiao, Meng, Li & Yuan, ICML 2025, arXiv 2502.12170; the authors'
code, Caiyun-AI/MUDDFormer, `pytorch/muddformer/modeling_muddformer.py`): after each block, per token, four weighted
sums over the embedding and every earlier block's output give the next block's query, key, value and residual
inputs, each with weights of its own computed from the block's output.

Legend:  b batch · t tokens · d model width · N blocks · i the block (0-based) · C ways (4: Q, K, V, R; or 1: R) ·
X_j the block outputs, X_0 = e the embedding · L_i = i + 2 the outputs after block i
    block 0        h = X_0 + Attn(RMSN(X_0));  X_1 = h + MLP(RMSN(h))      (`standard`'s block)
    block i > 0    q, k, v = W_q RMSN_q(x^Q), W_k RMSN_k(x^K), W_v RMSN_v(x^V)  (three pre-norms, one per way)
                   h = x^R + Attn(q, k, v);  X_{i+1} = h + MLP(RMSN(h))
    after block i  A = W_2 GELU(W_1 RMSN_unit(X_{i+1})) + a_i        (b, t, C, L_i): a weight per way and output
                   x^c = Σ_{j ≤ i+1} A[c, j] X_j   for each way c;   readout RMSN_f(x^R) after block N − 1
init (the authors' training code): W_1 ~ N(0, 1/d), W_2 = 0, a_i = 1 at the newest output X_{i+1}, 0 elsewhere, so
every way starts as X_{i+1}: the model starts as `standard` (gains 1). W_1's width, the authors': H_i = 4 L_i (C = 4)
or L_i (C = 1), times 4 in the last block (which feeds R alone), rounded up past the next multiple of 64.

`mudd_ways=r` keeps the residual way alone (the authors' `dense_type='l'`, a dynamic DenseFormer): every block reads
one input through one pre-norm. The weights belong to each block's MLP site (its last sublayer).

The state is `Mudd(inputs, slots)`: the C inputs of the next block (R last) and S = N + 1 slots, the outputs X_0 …
X_{i+1} last and, before them, empty slots (views of e), shifted as DenseFormer's (denseformer.py). So that every
block is one graph under `train.compile`, every MLP site holds the same shapes: W_1 (H, d) with H the largest H_i,
W_2 (C·S, H) and a (C, S); a 0/1 mask of its own H_i hidden units and of the (way, slot) weights it uses (the last
block: R's only) zeroes the rest (they multiply nothing and get a zero gradient; `params` counts all held). Eagerly
the sums read the used slots only, compiled all S, the same sum (DenseFormer's).
Block 0's attention site has one pre-norm (the authors'), the later ones three: two graphs under compile for `qkvr`.
The later attention sites project their three inputs with the rows of the attention's own QKV weight (`attach`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .base import KnobError, RuleKnobs, RuleSpec, Site, SiteInfo, Stream, StreamInfo
from .composition import Composition
from .norm import RMSNorm, unit_rms
from .single import PreNormSite
from .streams import upcast

WAYS = ("qkvr", "r")


class Mudd(NamedTuple):
    """MUDD's state: `inputs`, the next block's C inputs (Q, K, V, R or R alone, R last), and `slots`, S = N + 1
    tensors with the block outputs X_0 … X_{i+1} last, oldest first."""

    inputs: tuple[torch.Tensor, ...]
    slots: tuple[torch.Tensor, ...]


@dataclass
class MuddKnobs:
    mudd_ways: Literal["qkvr", "r"] = "qkvr"  # qkvr: four ways (the paper's MUDD); r: the residual's alone

    def check(self) -> None:
        if self.mudd_ways not in WAYS:
            raise KnobError(f"model.residual.mudd_ways must be qkvr or r, got {self.mudd_ways!r}")


def ways(cfg: RuleKnobs) -> int:
    return len(cfg.mudd_ways)


def round64(n: int) -> int:
    """The authors' rounding of W_1's width: past the next multiple of 64 (64 -> 128, as their code does)."""
    return (n // 64 + 1) * 64


def hidden_of(block: int, n_blocks: int, cfg: RuleKnobs) -> int:
    """H_i, the authors' width of block `block`'s W_1."""
    last = block == n_blocks - 1
    c = 1 if last else ways(cfg)
    return round64((block + 2) * c * (4 if last else 1))


def hidden(n_blocks: int, cfg: RuleKnobs) -> int:
    """H, the width every MLP site holds: the largest H_i."""
    return max(hidden_of(i, n_blocks, cfg) for i in range(n_blocks))


class MuddFirstSite(PreNormSite):
    """h ← h + F(RMSN(h)) on the residual input x^R; block 0's attention site (all blocks' with `mudd_ways=r`)."""

    def read(self, state: Mudd) -> tuple[torch.Tensor, Any]:
        return self.norm(state.inputs[-1]), None

    def write(self, state: Mudd, y: torch.Tensor, ctx: Any) -> Mudd:
        return Mudd(state.inputs[:-1] + (state.inputs[-1] + y,), state.slots)


class MuddQKVSite(MuddFirstSite):
    """Attention of block i > 0: q, k, v from the three inputs, each through its own pre-norm; h = x^R + Attn."""

    attention_inputs = True

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)  # `norm`: the query's pre-norm
        self.norm_k = RMSNorm(info.d_model, info.eps)
        self.norm_v = RMSNorm(info.d_model, info.eps)
        self._attn: tuple[nn.Module, ...] = ()  # a tuple: the block owns the attention, not this site

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return 3 * d

    def attach(self, branch: nn.Module) -> None:
        self._attn = (branch,)

    def read(self, state: Mudd) -> tuple[torch.Tensor, Any]:
        return self.norm(state.inputs[0]), state

    def qkv(self, project: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
            x: torch.Tensor, ctx: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """Each input through its own third of the attention's QKV weight (the authors' separate W_q, W_k, W_v):
        the FLOPs of one projection."""
        w = self._attn[0].qkv.weight  # (3d, d): q, k, v rows
        d = x.shape[-1]
        q = F.linear(x, w[:d])
        k = F.linear(self.norm_k(ctx.inputs[1]), w[d:2 * d])
        v = F.linear(self.norm_v(ctx.inputs[2]), w[2 * d:])
        return q, k, v, None

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        super().reset_parameters(generator)
        self.norm_k.reset_parameters()
        self.norm_v.reset_parameters()


class MuddSite(MuddFirstSite):
    """The MLP's site: X_{i+1} = h + F(RMSN(h)) enters the slots; then the C weighted sums give the next inputs."""

    no_decay = ("dense_bias",)

    def __init__(self, info: SiteInfo) -> None:
        super().__init__(info)  # `norm`: the MLP's pre-norm, of x^R = h
        d, n, c = info.d_model, info.n_blocks, ways(info.cfg)
        block, slots = info.index // 2, n + 1
        self.ways, self.slots = c, slots
        self.dense_in = nn.Linear(d, hidden(n, info.cfg), bias=False)  # W_1
        self.dense_out = nn.Linear(hidden(n, info.cfg), c * slots, bias=False)  # W_2, rows (way, slot)
        self.dense_bias = nn.Parameter(torch.empty(c, slots))  # a
        # the slots X_0 … X_{block+1} sit in after this block's output entered (X_{block+1} last); eager reads only
        self.positions = tuple(range(slots - (block + 2), slots))
        self.used = 1 if block == n - 1 else c  # ways this block feeds: R alone after the last block
        self.register_buffer("hidden_mask", torch.empty(self.dense_in.out_features), persistent=False)
        self.register_buffer("weight_mask", torch.empty(c, slots), persistent=False)
        self.reset_parameters()

    # `count` (PreNormSite's d): the norm only; W_1, W_2 and a depend on the depth and are counted by `params`

    def weights(self, x: torch.Tensor) -> torch.Tensor:
        """A = W_2 GELU(W_1 RMSN_unit(x)) + a, masked: (b, t, C, S) in fp32 or wider."""
        inner = F.gelu(self.dense_in(unit_rms(x, self.info.eps))) * self.hidden_mask.to(x.dtype)
        a = self.dense_out(inner).view(*x.shape[:-1], self.ways, self.slots)
        return (upcast(a) + upcast(self.dense_bias)) * self.weight_mask.to(upcast(a).dtype)

    def write(self, state: Mudd, y: torch.Tensor, ctx: Any) -> Mudd:
        x = state.inputs[-1] + y  # X_{block+1}
        slots = state.slots[1:] + (x,)
        a = self.weights(x)
        used = range(self.slots) if torch.compiler.is_compiling() else self.positions
        inputs = []
        for c in range(self.ways):
            out = a[..., c, used[0], None] * slots[used[0]]  # type promotion: fp32 sums of the stored outputs
            for p in used[1:]:
                out = out + a[..., c, p, None] * slots[p]
            inputs.append(out.to(x.dtype))
        return Mudd(tuple(inputs), slots)

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        """W_1 ~ N(0, 1/d) on this block's own H_i units (0 on the rest), W_2 = 0, a = 1 at the newest output."""
        super().reset_parameters(generator)
        info, d = self.info, self.info.d_model
        own = hidden_of(info.index // 2, info.n_blocks, info.cfg)
        with torch.no_grad():
            nn.init.normal_(self.dense_in.weight, std=1.0 / math.sqrt(d), generator=generator)
            self.dense_in.weight[own:].zero_()
            self.dense_out.weight.zero_()
            self.dense_bias.zero_()
            self.dense_bias[:, -1] = 1.0
            self.hidden_mask.zero_()
            self.hidden_mask[:own] = 1.0
            self.weight_mask.zero_()
            self.weight_mask[self.ways - self.used:, list(self.positions)] = 1.0


class MuddStream(Stream):
    """expand: every input and the newest slot X_0 = e, the S − 1 slots before it empty (distinct views of e);
    readout: RMSN_f(x^R)."""

    def __init__(self, info: StreamInfo) -> None:
        super().__init__(info)
        self.norm = RMSNorm(info.d_model, info.eps)
        self.ways, self.slots = ways(info.cfg), 1 + info.n_sublayers // 2

    @classmethod
    def count(cls, d: int, cfg: RuleKnobs) -> int:
        return d

    def expand(self, e: torch.Tensor) -> Mudd:
        """Distinct view objects (no tensor handed to the first block twice: it would compile a graph of its own)."""
        return Mudd(tuple(e.view_as(e) for _ in range(self.ways)),
                    tuple(e.view_as(e) for _ in range(self.slots - 1)) + (e,))

    def readout(self, state: Mudd) -> torch.Tensor:
        return self.norm(state.inputs[-1])

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        self.norm.reset_parameters()


def make_site(info: SiteInfo) -> Site:
    if info.kind == "mlp":
        return MuddSite(info)
    return (MuddQKVSite if info.index > 0 and ways(info.cfg) > 1 else MuddFirstSite)(info)


def params(d: int, n_sublayers: int, cfg: RuleKnobs) -> int:
    n, c = n_sublayers // 2, ways(cfg)  # n blocks: attention sites 2i, MLP sites 2i + 1
    later = (MuddQKVSite if c > 1 else MuddFirstSite).count(d, cfg)
    h, s = hidden(n, cfg), n + 1
    return MuddStream.count(d, cfg) + d + (n - 1) * later + n * (d + d * h + h * c * s + c * s)


def flops(d: int, n_sublayers: int, cfg: RuleKnobs) -> int:
    """The weighted sums per token: 2d forward and 4d backward per (way, output) a block reads, C·N(N+3)/2 of them
    in all (the held W_1, W_2, a are counted with the parameters, 6 each)."""
    n = n_sublayers // 2
    return 6 * d * ways(cfg) * (n * (n + 3) // 2)


SPEC = RuleSpec(name="mudd", site=make_site, stream=MuddStream, params=params, knobs=(MuddKnobs,), flops=flops,
                # the multiplier on each sublayer's update u; W_1 reads the width (a hidden matrix drawn at 1/fan_in);
                # W_2 (fan-in H, fixed) and a set how the carried outputs mix: carry scalars, as DenseFormer's α
                composition=Composition(matrices=("dense_in.weight",),
                                        vectors=("norm.weight", "norm_k.weight", "norm_v.weight"),
                                        carry_scalars=("dense_out.weight", "dense_bias")),
                summary="per token, Q, K, V and residual inputs = dynamic weighted sums of every earlier block output "
                        "(MUDDFormer)")
