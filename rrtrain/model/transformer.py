"""Decoder-only transformer whose residual connections are a pluggable rule.

The paper's setup: pre-RMSNorm, causal attention through scaled_dot_product_attention, GELU MLP,
tied input/output embeddings, final RMSNorm, learned absolute positions (RoPE optional), GPT-2
initialisation with residual-projection scaling, fp32 next-token cross-entropy.

Where the norms sit and how a sublayer's output is merged is the residual rule's business
(`rrtrain.residuals`): the block below only calls read/write and never looks at the rule's name.
This module is single-device: no distributed code lives here (see rrtrain/parallel/).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from rrtrain import residuals
from rrtrain.config import ModelConfig, ResidualConfig
from rrtrain.model.sizing import ModelShape, resolve_shape
from rrtrain.residuals import RuleSpec, Site, SiteInfo, Stream, StreamInfo


class Rotary(nn.Module):
    """Rotary position embedding; cos/sin tables are non-persistent buffers rebuilt by reset_parameters."""

    def __init__(self, head_dim: int, seq_len: int, base: float) -> None:
        super().__init__()
        self.head_dim, self.seq_len, self.base = head_dim, seq_len, base
        self.register_buffer("cos", torch.empty(seq_len, head_dim // 2), persistent=False)
        self.register_buffer("sin", torch.empty(seq_len, head_dim // 2), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        inv = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, device=self.cos.device).float() / self.head_dim))
        angles = torch.outer(torch.arange(self.seq_len, device=self.cos.device).float(), inv)
        with torch.no_grad():
            self.cos.copy_(angles.cos())
            self.sin.copy_(angles.sin())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, H, T, hd)
        t = x.shape[-2]
        cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return out.flatten(-2)


class Attention(nn.Module):
    def __init__(self, shape: ModelShape, rope_base: float) -> None:
        super().__init__()
        self.n_heads = shape.n_heads
        self.qkv = nn.Linear(shape.d_model, 3 * shape.d_model, bias=False)
        self.proj = nn.Linear(shape.d_model, shape.d_model, bias=False)  # residual projection
        self.rotary = Rotary(shape.head_dim, shape.seq_len, rope_base) if shape.pos == "rope" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, -1).transpose(1, 2) for z in (q, k, v))  # (B, H, T, hd)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, hd)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.fc = nn.Linear(shape.d_model, shape.d_ff, bias=False)
        self.proj = nn.Linear(shape.d_ff, shape.d_model, bias=False)  # residual projection

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Attention then MLP, each wrapped by its residual site. Knows nothing about which rule it runs."""

    def __init__(self, shape: ModelShape, attn_site: Site, mlp_site: Site, rope_base: float) -> None:
        super().__init__()
        self.attn_site, self.attn = attn_site, Attention(shape, rope_base)
        self.mlp_site, self.mlp = mlp_site, MLP(shape)

    def forward(self, state: Any) -> Any:
        x, ctx = self.attn_site.read(state)  # x: (B, T, D)
        state = self.attn_site.write(state, self.attn(x), ctx)
        x, ctx = self.mlp_site.read(state)
        return self.mlp_site.write(state, self.mlp(x), ctx)


class Transformer(nn.Module):
    """Token (+ position) embedding -> rule.expand -> blocks -> rule.readout -> tied LM head."""

    def __init__(self, shape: ModelShape, rule: RuleSpec, rcfg: ResidualConfig, norm_eps: float = 1e-6,
                 init_std: float = 0.02, rope_base: float = 10000.0, seed: Optional[int] = 0) -> None:
        """`rule` is the registry's spec, not a name: the run was resolved against the registry once
        (rrtrain.resolve). Initialised from `seed`; `seed=None` (or a meta build) leaves that to the caller, who
        initialises the tensors where they end up (rrtrain.parallel.materialize, DeepSpeed's zero.Init)."""
        super().__init__()
        self.shape, self.rule, self.variant, self.init_std = shape, rule, rule.name, init_std
        self.rcfg, self.norm_eps, self.rope_base = rcfg, norm_eps, rope_base
        self.tok_emb: nn.Embedding
        self.pos_emb: Optional[nn.Embedding]
        self.stream: Stream
        self.make_ends(self)
        self.blocks = nn.ModuleList(self.make_block(i) for i in range(shape.n_layers))
        if seed is not None and not self.tok_emb.weight.is_meta:
            self.init_weights(seed)

    def make_ends(self, holder: nn.Module) -> None:
        """Give `holder` (this model, or the template of unit 0) the embeddings and the rule's stream."""
        shape, d = self.shape, self.shape.d_model
        holder.tok_emb = nn.Embedding(shape.vocab_size, d)
        holder.pos_emb = nn.Embedding(shape.seq_len, d) if shape.pos == "learned" else None
        holder.stream = self.rule.stream(StreamInfo(d, shape.n_sublayers, self.norm_eps, self.rcfg))
        holder.stream.attach(holder.tok_emb, holder.pos_emb)  # for rules that reach inside (Fixup); no-op by default

    def make_block(self, i: int) -> Block:
        """Block `i` with its two residual sites attached (for this model, or as the template of unit i + 1)."""
        shape, rcfg, eps = self.shape, self.rcfg, self.norm_eps
        d, n_sub = shape.d_model, shape.n_sublayers
        block = Block(shape, self.rule.site(SiteInfo(d, 2 * i, n_sub, "attn", eps, rcfg)),
                      self.rule.site(SiteInfo(d, 2 * i + 1, n_sub, "mlp", eps, rcfg)), self.rope_base)
        block.attn_site.attach(block.attn)
        block.mlp_site.attach(block.mlp)
        return block

    # -- initialisation, one unit at a time ---------------------------------------------------

    @property
    def n_units(self) -> int:
        """Initialisation units: 0 = the ends (embeddings, stream, final norm), i + 1 = block i."""
        return 1 + self.shape.n_layers

    def unit_prefix(self, u: int) -> str:
        """The prefix of unit `u`'s names in this model's named_parameters / named_buffers."""
        return "" if u == 0 else f"blocks.{u - 1}."

    def unit(self, u: int) -> nn.Module:
        """This model's own unit `u`: the model itself for the ends (init_unit touches only those), else a block."""
        return self if u == 0 else self.blocks[u - 1]

    def unit_template(self, u: int, device: torch.device | str = "cpu") -> nn.Module:
        """A fresh, uninitialised copy of unit `u` on `device` whose names match this model's under
        `unit_prefix(u)`: where a sharded model's units are initialised in full, one at a time."""
        with torch.device("meta"):
            if u == 0:
                template = nn.Module()
                self.make_ends(template)
            else:
                template = self.make_block(u - 1)
        return template.to_empty(device=device)

    def init_unit(self, u: int, unit: Any, generator: torch.Generator) -> None:
        """Initialise unit `u` (this model's own, or its template) from `generator` alone, so the weights do
        not depend on how the model is laid out over devices.

        - embeddings, QKV and the MLP's first layer: N(0, init_std)              (GPT-2)
        - output projections of both sublayers: N(0, init_std / sqrt(2 * n_layers)) (GPT-2 residual scaling)
        - a rule with `branch_init_gain` (DeepNorm's beta) multiplies V, the output projections and the MLP
        - each residual site and the stream: their own reset_parameters (gates at r = 0.5, ReZero at 0, ...),
          last, so a rule that re-initialises what it was attached to (Fixup's branches) has the final word
        """
        std, n, d = self.init_std, self.shape.n_layers, self.shape.d_model
        gain = self.rule.branch_init_gain(n) if self.rule.branch_init_gain else 1.0
        with torch.no_grad():
            if u == 0:
                nn.init.normal_(unit.tok_emb.weight, std=std, generator=generator)
                if unit.pos_emb is not None:
                    nn.init.normal_(unit.pos_emb.weight, std=std, generator=generator)
                unit.stream.reset_parameters(generator)
                return
            nn.init.normal_(unit.attn.qkv.weight, std=std, generator=generator)
            unit.attn.qkv.weight[2 * d:].mul_(gain)  # value rows
            nn.init.normal_(unit.mlp.fc.weight, std=std * gain, generator=generator)
            for proj in (unit.attn.proj, unit.mlp.proj):
                nn.init.normal_(proj.weight, std=gain * std / math.sqrt(2 * n), generator=generator)
            if unit.attn.rotary is not None:
                unit.attn.rotary.reset_parameters()
            unit.attn_site.reset_parameters(generator)
            unit.mlp_site.reset_parameters(generator)

    def init_weights(self, seed: int) -> None:
        """Initialise a model whose tensors are all here and whole (one process; after `to_empty`).
        The same values as a sharded model materialised by rrtrain.parallel.materialize for this seed."""
        for u in range(self.n_units):
            self.init_unit(u, self.unit(u), unit_generator(seed, u))

    def sites(self) -> list[Site]:
        return [s for b in self.blocks for s in (b.attn_site, b.mlp_site)]

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> the tensor that enters the LM head (B, T, D)."""
        t = idx.shape[1]
        e = self.tok_emb(idx)  # (B, T, D)
        if self.pos_emb is not None:
            e = e + self.pos_emb(torch.arange(t, device=idx.device))
        state = self.stream.expand(e)
        for block in self.blocks:
            state = block(state)
        return self.stream.readout(state)

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Logits (B, T, V), or the mean next-token cross-entropy in fp32 when `targets` is given."""
        z = self.hidden(idx)
        logits = F.linear(z, self.tok_emb.weight)  # tied LM head
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1)


def unit_generator(seed: int, unit: int) -> torch.Generator:
    """The CPU generator initialising unit `unit` of a model seeded `seed`: a stream of its own per unit, so
    a unit's weights are the same whichever rank, device or order initialises it."""
    digest = hashlib.blake2b(f"rrtrain-init:{seed}:{unit}".encode(), digest_size=8).digest()
    return torch.Generator(device="cpu").manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))


def build_model(m: ModelConfig, vocab_size: Optional[int] = None, device: torch.device | str | None = None,
                shape: Optional[ModelShape] = None, seed: Optional[int] = 0,
                rule: Optional[RuleSpec] = None) -> Transformer:
    """Build the model a config describes, initialised from `seed`. `device="meta"` builds without allocating
    or initialising (training's path: rrtrain.parallel.materialize initialises each rank's shards).
    A resolved run passes its `shape` and `rule`; without them they are worked out from `m` here."""
    shape = shape or resolve_shape(m, vocab_size)
    rule = rule or residuals.get(m.variant)
    with torch.device(device or "cpu"):
        return Transformer(shape, rule, m.residual, m.norm_eps, m.init_std, m.rope_base, seed)
