"""Decoder-only transformer whose residual connections are a pluggable rule.

The paper's setup: pre-RMSNorm, causal attention through scaled_dot_product_attention, GELU MLP,
tied input/output embeddings, final RMSNorm, learned absolute positions (RoPE optional), GPT-2
initialisation with residual-projection scaling, fp32 next-token cross-entropy.

Where the norms sit and how a sublayer's output is merged is the residual rule's business
(`rrtrain.residuals`): the block below only calls read/write and never looks at the rule's name. The model
is built from a `ModelSpec` (rrtrain/model/spec.py), which carries the rule's spec and knobs, so this module
imports neither the rules nor any config: with rrtrain/residuals/ it is what an export copies.
This module is single-device: no distributed code lives here (see rrtrain/parallel/).

Training calls `forward(idx, targets)`: causal attention over whole sequences (scaled_dot_product_attention with
`is_causal=True`), or with `spec.doc_mask` causal within each document of a packed row (`document_attend`).
Inference may also pass a padding mask, explicit positions and a key/value cache (`Attend`):
padded keys are never attended to, positions count from each row's first real token, and only attention keys
and values are cached, since every residual rule acts on each position alone (its state at a position depends
on that position's embedding and the attention outputs there, never on another position directly).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .parametrization import matches, refusal
from .spec import ModelShape, ModelSpec


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

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (B, H, T, hd), rotated for positions 0..T-1, or for `positions` (B, T) where given."""
        if positions is None:
            t = x.shape[-2]
            cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        else:  # (B, 1, T, hd/2): the same table entries, per row
            cos, sin = self.cos[positions].unsqueeze(1).to(x.dtype), self.sin[positions].unsqueeze(1).to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return out.flatten(-2)


@dataclass(frozen=True)
class Attend:
    """How attention runs outside training: for a padded batch, or a step of decoding against a cache.

    `positions` (B, T): each query's position, counted from its row's first real token (RoPE and the learned
    table use it). `mask` (B, 1, T, K) bool, True where a query may attend to a key: causal, no padded key, and a
    padded query attends to itself alone (so its values stay finite and never reach a real token); None when
    plain causal attention is exact (`is_causal`: T = K; or a single query, which sees every key). `cache`:
    transformers' Cache API (`DynamicCache`), `update(k, v, layer) -> (all keys, all values)`; None: no cache.
    """

    positions: torch.Tensor
    mask: Optional[torch.Tensor]
    is_causal: bool
    cache: Any = None


class Attention(nn.Module):
    def __init__(self, shape: ModelShape, rope_base: float, layer: int = 0) -> None:
        super().__init__()
        self.n_heads, self.layer = shape.n_heads, layer  # layer: this attention's index in a key/value cache
        self.qkv = nn.Linear(shape.d_model, 3 * shape.d_model, bias=False)
        self.proj = nn.Linear(shape.d_model, shape.d_model, bias=False)  # residual projection
        self.rotary = Rotary(shape.head_dim, shape.seq_len, rope_base) if shape.pos == "rope" else None
        self.scale: Optional[float] = None  # None: 1/sqrt(head_dim); mup/completep: 1/head_dim (set by the model)

    def forward(self, x: torch.Tensor, attend: Optional[Attend] = None) -> torch.Tensor:
        return self.attend_qkv(*self.project(x), attend)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, T, D) each: the QKV projection of x (B, T, D), before the heads are split and rotated."""
        return self.qkv(x).split(x.shape[-1], dim=-1)

    def attend_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   attend: Optional[Attend] = None) -> torch.Tensor:
        """Attention over projected q, k, v (B, T, D) each (`project`'s, or what a residual site made of them), then
        the output projection."""
        b, t, d = q.shape
        q, k, v = (z.view(b, t, self.n_heads, -1).transpose(1, 2) for z in (q, k, v))  # (B, H, T, hd)
        if attend is None:  # training: whole sequences from position 0
            if self.rotary is not None:
                q, k = self.rotary(q), self.rotary(k)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)  # (B, H, T, hd)
        else:
            if self.rotary is not None:
                q, k = self.rotary(q, attend.positions), self.rotary(k, attend.positions)
            if attend.cache is not None:
                k, v = attend.cache.update(k, v, self.layer)  # (B, H, K, hd): the cached ones, then these
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attend.mask, is_causal=attend.is_causal,
                                               scale=self.scale)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.fc = nn.Linear(shape.d_model, shape.d_ff, bias=False)
        self.proj = nn.Linear(shape.d_ff, shape.d_model, bias=False)  # residual projection

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Attention then MLP, each wrapped by its residual site. Knows nothing about which rule it runs: it asks the
    attention site whether it declares `attention_inputs` (then the site gives attention its q, k, v)."""

    def __init__(self, shape: ModelShape, attn_site: nn.Module, mlp_site: nn.Module, rope_base: float,
                 layer: int = 0) -> None:
        super().__init__()
        self.attn_site, self.attn = attn_site, Attention(shape, rope_base, layer)
        self.mlp_site, self.mlp = mlp_site, MLP(shape)
        # completep's m_L^-alpha on each sublayer's update u, for a rule whose composition puts it there; None: u as
        # it is (sp, mup, or a rule that applies it in its own write). The same in every block (one compiled graph).
        self.branch_mult: Optional[float] = None
        self.attach_sites()

    def attach_sites(self) -> None:
        """Show each site its sublayer (a rule may hook its layers: Fixup's scalar biases); again after anything
        swaps those layers (float8's conversion), so the hooks sit on the layers that run."""
        self.attn_site.attach(self.attn)
        self.mlp_site.attach(self.mlp)

    def forward(self, state: Any, attend: Optional[Attend] = None) -> Any:
        x, ctx = self.attn_site.read(state)  # x: (B, T, D)
        if self.attn_site.attention_inputs:  # the site gives attention its q, k, v (value residuals)
            q, k, v, ctx = self.attn_site.qkv(self.attn.project, x, ctx)
            y = self.attn.attend_qkv(q, k, v, attend)
        else:
            y = self.attn(x) if attend is None else self.attn(x, attend)
        if self.branch_mult is not None:
            y = y * self.branch_mult
        state = self.attn_site.write(state, y, ctx)
        x, ctx = self.mlp_site.read(state)
        y = self.mlp(x)
        if self.branch_mult is not None:
            y = y * self.branch_mult
        return self.mlp_site.write(state, y, ctx)


class Transformer(nn.Module):
    """Token (+ position) embedding -> rule.expand -> blocks -> rule.readout -> tied LM head."""

    def __init__(self, spec: ModelSpec, seed: Optional[int] = 0) -> None:
        """`spec.rule` is the registry's spec, not a name: the run was resolved against the registry once
        (rrtrain.resolve). Initialised from `seed`; `seed=None` (or a meta build) leaves that to the caller, who
        initialises the tensors where they end up (rrtrain.parallel.materialize, DeepSpeed's zero.Init)."""
        super().__init__()
        self.spec = spec
        self.shape, self.rule, self.variant, self.init_std = spec.shape, spec.rule, spec.rule.name, spec.init_std
        self.knobs, self.norm_eps, self.rope_base = spec.knobs, spec.norm_eps, spec.rope_base
        check_doc_mask(spec)
        self.param = spec.parametrization
        refused = refusal(self.param, self.rule)
        if refused:
            raise ValueError(refused)
        # mup/completep: the tied head's input x 1/m_w; None under sp (nothing multiplied)
        self.logit_mult: Optional[float] = self.param.logit_multiplier(spec.shape)
        shape = self.shape
        self.tok_emb: nn.Embedding
        self.pos_emb: Optional[nn.Embedding]
        self.stream: Any  # the rule's Stream
        self.make_ends(self)
        self.blocks = nn.ModuleList(self.make_block(i) for i in range(shape.n_layers))
        if seed is not None and not self.tok_emb.weight.is_meta:
            self.init_weights(seed)

    def make_ends(self, holder: nn.Module) -> None:
        """Give `holder` (this model, or the template of unit 0) the embeddings and the rule's stream."""
        shape, d = self.shape, self.shape.d_model
        holder.tok_emb = nn.Embedding(shape.vocab_size, d)
        holder.pos_emb = nn.Embedding(shape.seq_len, d) if shape.pos == "learned" else None
        holder.stream = self.rule.make_stream(d, shape.n_sublayers, self.norm_eps, self.knobs)
        holder.stream.attach(holder.tok_emb, holder.pos_emb)  # for rules that reach inside (Fixup); no-op by default

    def make_block(self, i: int) -> Block:
        """Block `i` with its two residual sites attached (for this model, or as the template of unit i + 1)."""
        shape, knobs, eps = self.shape, self.knobs, self.norm_eps
        d, n_sub = shape.d_model, shape.n_sublayers
        mult = self.param.branch_multiplier(shape)
        in_write = mult is not None and self.rule.composition.branch == "write"
        extra = {"branch_multiplier": mult} if in_write else {}  # only then: a rule's own make_site may not take it
        block = Block(shape, self.rule.make_site(d, 2 * i, n_sub, "attn", eps, knobs, **extra),
                      self.rule.make_site(d, 2 * i + 1, n_sub, "mlp", eps, knobs, **extra), self.rope_base, layer=i)
        block.attn.scale = self.param.attention_scale(shape)
        # a rule's knob may switch it off (attnres, the convex gates)
        off = mult is not None and not self.rule.composition.applies_branch(knobs)
        block.branch_mult = None if in_write or off else mult
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
        - output projections of both sublayers: N(0, init_std / sqrt(2 * n_layers)) (GPT-2 residual scaling;
          N(0, init_std) for a rule that declares `depth_scaled_output_init = False`, LayerNorm Scaling)
        - a rule with `branch_init_gain` (DeepNorm's beta) multiplies V, the output projections and the MLP
        - each residual site and the stream: their own reset_parameters (gates at r = 0.5, ReZero at 0, ...),
          last, so a rule that re-initialises what it was attached to (Fixup's branches) has the final word
        Under mup/completep (docs/transfer.md) the same draws in the same order, the hidden matrices at std /
        sqrt(m_w), the output projections without 1/sqrt(2L) under completep; then the rule's declared
        composition (`compose_init`): its fixed-std matrices x m_w^-1/2, its convex gates' start depth-aware.
        """
        std, n, d, p = self.init_std, self.shape.n_layers, self.shape.d_model, self.param
        gain = self.rule.branch_init_gain(n) if self.rule.branch_init_gain else 1.0
        hidden = std if p.is_sp else p.hidden_std(std, self.shape)
        with torch.no_grad():
            if u == 0:
                nn.init.normal_(unit.tok_emb.weight, std=std, generator=generator)
                if unit.pos_emb is not None:
                    nn.init.normal_(unit.pos_emb.weight, std=std, generator=generator)
                unit.stream.reset_parameters(generator)
                self.compose_init(unit.stream)
                return
            nn.init.normal_(unit.attn.qkv.weight, std=hidden, generator=generator)
            unit.attn.qkv.weight[2 * d:].mul_(gain)  # value rows
            nn.init.normal_(unit.mlp.fc.weight, std=hidden * gain, generator=generator)
            depth = math.sqrt(2 * n) if p.output_depth_scaled(self.rule.depth_scaled_output_init) else 1.0
            for proj in (unit.attn.proj, unit.mlp.proj):
                nn.init.normal_(proj.weight, std=gain * hidden / depth, generator=generator)
            if unit.attn.rotary is not None:
                unit.attn.rotary.reset_parameters()
            unit.attn_site.reset_parameters(generator)
            unit.mlp_site.reset_parameters(generator)
            self.compose_init(unit.attn_site)
            self.compose_init(unit.mlp_site)

    def compose_init(self, module: nn.Module) -> None:
        """Apply the rule's composition to the start its `reset_parameters` just drew (`init_unit`); nothing
        under sp."""
        comp, p = self.rule.composition, self.param
        if p.is_sp:
            return
        m_w, m_l = p.width_mult(self.shape), p.depth_mult(self.shape)
        for name, param in module.named_parameters():
            if m_w != 1.0 and matches(name, comp.scaled_init):
                param.mul_(m_w ** -0.5)
            if p.depth and m_l != 1.0 and matches(name, comp.carry_gates):  # r0 -> 1 - (1 - r0)^(1/m_L)
                r = -torch.expm1(torch.log1p(-torch.sigmoid(param.double())) / m_l)
                param.copy_((torch.log(r) - torch.log1p(-r)).to(param.dtype))

    def init_weights(self, seed: int) -> None:
        """Initialise a model whose tensors are all here and whole (one process; after `to_empty`).
        The same values as a sharded model materialised by rrtrain.parallel.materialize for this seed."""
        for u in range(self.n_units):
            self.init_unit(u, self.unit(u), unit_generator(seed, u))

    def sites(self) -> list[Any]:
        """The residual sites (rrtrain.residuals.Site), in sublayer order."""
        return [s for b in self.blocks for s in (b.attn_site, b.mlp_site)]

    def hidden(self, idx: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
               position_ids: Optional[torch.Tensor] = None, cache: Any = None) -> torch.Tensor:
        """Token ids (B, T) -> the tensor that enters the LM head (B, T, D). Without the optional arguments
        (training): whole sequences, causal (with `spec.doc_mask`: causal within each document of the row; with
        any of the optional arguments each row is one document, so generation runs one document per sequence).
        `attention_mask` (B, K), 1 on real tokens and 0 on padding, covers
        the cached tokens and these (K = cached + T); `position_ids` (B, T) default to counting each row's
        real tokens; `cache` is transformers' Cache API (`get_seq_length`, `update`), extended here."""
        past = cache.get_seq_length() if cache is not None else 0
        check_length(past + idx.shape[1], self.shape.seq_len)
        if attention_mask is None and position_ids is None and cache is None:
            if self.spec.doc_mask:  # block-diagonal by document (`document_attend`)
                attend = document_attend(idx, self.spec.eod_id, self.spec.doc_positions == "restart")
                return self.readout_of(self.embed(idx, attend.positions), attend)
            return self.readout_of(self.embed(idx, None), None)
        attend = attend_for(idx, attention_mask, position_ids, cache, past, self.shape.seq_len)
        return self.readout_of(self.embed(idx, attend.positions), attend)

    def embed(self, idx: torch.Tensor, positions: Optional[torch.Tensor]) -> torch.Tensor:
        """Token (+ learned position) embeddings (B, T, D); positions 0..T-1 unless `positions` (B, T)."""
        e = self.tok_emb(idx)  # (B, T, D)
        if self.pos_emb is not None:
            e = e + self.pos_emb(torch.arange(idx.shape[1], device=idx.device) if positions is None else positions)
        return e

    def readout_of(self, e: torch.Tensor, attend: Optional[Attend]) -> torch.Tensor:
        state = self.stream.expand(e)
        for block in self.blocks:
            state = block(state) if attend is None else block(state, attend)
        return self.stream.readout(state)

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None, position_ids: Optional[torch.Tensor] = None,
                cache: Any = None) -> torch.Tensor:
        """Logits (B, T, V), or the mean next-token cross-entropy in fp32 when `targets` is given; the mask,
        positions and cache as in `hidden`."""
        z = self.hidden(idx, attention_mask, position_ids, cache)
        if self.logit_mult is not None:  # mup/completep: 1/m_w (on the head's input: the same as on the logits)
            z = z * self.logit_mult
        logits = F.linear(z, self.tok_emb.weight)  # tied LM head
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1)


def check_length(length: int, max_length: int) -> None:
    """A sequence longer than the model's positions is refused in words (it would fail on an index otherwise)."""
    if length > max_length:
        raise ValueError(f"a sequence of {length} tokens is longer than the model's maximum length of "
                         f"{max_length} tokens (its seq_len, max_position_embeddings)")


def attend_for(idx: torch.Tensor, attention_mask: Optional[torch.Tensor], position_ids: Optional[torch.Tensor],
               cache: Any, past: int, max_length: int) -> Attend:
    """The positions and mask of T new tokens after `past` cached ones (see `Attend`)."""
    b, t = idx.shape
    keys = past + t
    device = idx.device
    if attention_mask is not None:
        if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (b, keys):
            raise ValueError(f"attention_mask must be (batch, cached + new tokens) = ({b}, {keys}), "
                             f"got {tuple(attention_mask.shape)}")
        real = attention_mask.to(device=device, dtype=torch.bool)
    if position_ids is not None:
        if tuple(position_ids.shape) not in ((b, t), (1, t)):
            raise ValueError(f"position_ids must be (batch, new tokens) = ({b}, {t}), got {tuple(position_ids.shape)}")
        positions = position_ids.to(device=device, dtype=torch.long).expand(b, t)
        if t and (int(positions.min()) < 0 or int(positions.max()) >= max_length):
            raise ValueError(f"position_ids must lie in [0, {max_length}) (the model's maximum length), got "
                             f"{int(positions.min())}..{int(positions.max())}")
    elif attention_mask is not None:  # count each row's real tokens; a padded position takes any valid one
        positions = (real.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
    else:
        positions = torch.arange(past, keys, device=device).expand(b, t)
    padded = attention_mask is not None and not bool(real.all())
    if not padded and (past == 0 or t == 1):  # plain causal attention is exact: keep the fused kernel
        return Attend(positions=positions, mask=None, is_causal=t > 1, cache=cache)
    query_at = torch.arange(past, keys, device=device)[:, None]  # (T, 1): each query's index among the keys
    key_at = torch.arange(keys, device=device)[None, :]  # (1, K)
    mask = (key_at <= query_at)[None]  # (1, T, K) causal
    if attention_mask is not None:
        mask = (mask & real[:, None, :]) | (key_at == query_at)[None]  # no padded key; a query sees itself
    return Attend(positions=positions, mask=mask[:, None], is_causal=False, cache=cache)


DOC_POSITIONS = ("restart", "continue")


def check_doc_mask(spec: ModelSpec) -> None:
    """Refuse document-masking settings the model cannot run, in one line."""
    if spec.doc_positions not in DOC_POSITIONS:
        raise ValueError(f"doc_positions must be one of {', '.join(DOC_POSITIONS)}, got {spec.doc_positions!r}")
    if not spec.doc_mask:
        return
    if spec.eod_id is None:
        raise ValueError("doc_mask needs the end-of-document token id (eod_id; a run takes its dataset's "
                         "manifest eos_id)")
    if not 0 <= spec.eod_id < spec.shape.vocab_size:
        raise ValueError(f"eod_id {spec.eod_id} is not a token id of the model's vocabulary of "
                         f"{spec.shape.vocab_size}")


def document_attend(idx: torch.Tensor, eod_id: int, restart: bool) -> Attend:
    """Attention within each document of packed rows (B, T): a document ends at its end-of-document token
    `eod_id` (which belongs to it), the next one starts after it; a query attends to the keys of its own
    document up to itself. A boolean mask (B, 1, T, T) for scaled_dot_product_attention, which runs forward
    and backward on every device and compiles (flex attention has no backward on CPU in torch 2.14).
    Positions count from each document's first token when `restart`, else from the row's. No host sync."""
    b, t = idx.shape
    at = torch.arange(t, device=idx.device)
    ends = idx == eod_id
    first = torch.zeros_like(ends)
    first[:, 1:] = ends[:, :-1]
    first[:, 0] = True
    start = torch.where(first, at, 0).cummax(dim=-1).values  # (B, T): each token's document's first index
    positions = at - start if restart else at.expand(b, t)
    mask = (at[None, None, :] >= start[:, :, None]) & (at[None, None, :] <= at[None, :, None])  # (B, T, T)
    return Attend(positions=positions, mask=mask[:, None], is_causal=False)


def unit_generator(seed: int, unit: int) -> torch.Generator:
    """The CPU generator initialising unit `unit` of a model seeded `seed`: a stream of its own per unit, so
    a unit's weights are the same whichever rank, device or order initialises it."""
    digest = hashlib.blake2b(f"rrtrain-init:{seed}:{unit}".encode(), digest_size=8).digest()
    return torch.Generator(device="cpu").manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))


def build_model(spec: ModelSpec, device: torch.device | str | None = None, seed: Optional[int] = 0) -> Transformer:
    """The model `spec` describes, initialised from `seed`. `device="meta"` builds without allocating or
    initialising (training's path: rrtrain.parallel.materialize initialises each rank's shards). A run's
    config becomes a spec in rrtrain.resolve (`model_spec`, and `build_model` there from a config section)."""
    with torch.device(device or "cpu"):
        return Transformer(spec, seed)
