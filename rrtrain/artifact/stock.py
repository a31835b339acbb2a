"""The `standard` rule <-> a stock transformers architecture (Arcee, `ArceeForCausalLM`), both ways: `to_hf` (what
`rrtrain export --stock` writes, rrtrain/export/stock.py) and `from_hf` (what a warm start `init.from: hf:PATH` or
an Arcee export reads, rrtrain/artifact/warm.py). Plain tensors and a config mapping: no transformers import.

rrtrain's `standard` is pre-RMSNorm (gain, no bias, statistics in fp32), fused QKV without bias, causal attention
with 1/sqrt(head_dim) scaling, a non-gated GELU (erf) MLP without biases, a final RMSNorm and a tied LM head;
positions are learned absolute embeddings (`model.pos=learned`, the default) or RoPE on interleaved pairs
(`model.pos=rope`). Arcee is that block exactly (RMSNorm, `down(act(up(x)))` with `hidden_act="gelu"`, no biases,
tied embeddings, RoPE) with RoPE on the two halves of each head instead of interleaved pairs: permuting the query
and key rows of each head (0, 2, 4, ..., 1, 3, 5, ...) turns one into the other, and the attention scores,
products of a query and a key permuted alike, are unchanged. Arcee has no learned position table, and no other
architecture in transformers pairs RMSNorm with learned absolute positions (GPT-2, OPT, BioGPT, XGLM, GPT-BigCode
and Falcon use LayerNorm, whose mean subtraction no weights undo), so `standard` with learned positions has no
stock form; docs/evaluation.md lists what was checked.
"""

from __future__ import annotations

from typing import Any

import torch

from rrtrain.sizing import ModelShape

ARCHITECTURE = "ArceeForCausalLM"


def stock_problem(variant: str, shape: ModelShape, residual_values: dict[str, Any]) -> str | None:
    """Why this model has no stock form (None: it maps onto Arcee exactly)."""
    if variant != "standard":
        return f"only 'standard' has a stock architecture, this run trained '{variant}' (export it without --stock)"
    if shape.pos != "rope":
        return ("'standard' with learned absolute positions (model.pos=learned) matches no stock architecture: those "
                "with learned positions use LayerNorm, not RMSNorm; only model.pos=rope maps onto Arcee")
    return None


def interleaved_to_halves(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a query or key projection reordered from RoPE on pairs (2i, 2i+1) to RoPE on halves (i, i + hd/2)."""
    hd = w.shape[0] // n_heads
    order = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])
    return w.view(n_heads, hd, -1)[:, order].reshape(w.shape)


def to_hf(sd: dict[str, torch.Tensor], shape: ModelShape) -> dict[str, torch.Tensor]:
    """Arcee's tensor names and layout for a `standard` Transformer's state dict (the LM head stays tied)."""
    d, h = shape.d_model, shape.n_heads
    out = {"model.embed_tokens.weight": sd["tok_emb.weight"], "model.norm.weight": sd["stream.norm.weight"]}
    for i in range(shape.n_layers):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        q, k, v = sd[src + "attn.qkv.weight"].split(d, dim=0)
        out.update({
            dst + "input_layernorm.weight": sd[src + "attn_site.norm.weight"],
            dst + "self_attn.q_proj.weight": interleaved_to_halves(q, h),
            dst + "self_attn.k_proj.weight": interleaved_to_halves(k, h),
            dst + "self_attn.v_proj.weight": v,
            dst + "self_attn.o_proj.weight": sd[src + "attn.proj.weight"],
            dst + "post_attention_layernorm.weight": sd[src + "mlp_site.norm.weight"],
            dst + "mlp.up_proj.weight": sd[src + "mlp.fc.weight"],
            dst + "mlp.down_proj.weight": sd[src + "mlp.proj.weight"],
        })
    return out



#: rrtrain's name for `to_hf` (the export's own)
state_dict = to_hf


def halves_to_interleaved(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """`interleaved_to_halves` undone: rows from RoPE on halves back to RoPE on pairs."""
    hd = w.shape[0] // n_heads
    order = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(hd)
    return w.view(n_heads, hd, -1)[:, inverse].reshape(w.shape)


#: Llama-family architectures that are not `standard`, and why (one line each)
NOT_STANDARD = {
    "LlamaForCausalLM": "its MLP is gated (SiLU(gate_proj) * up_proj), `standard`'s a plain GELU one: no weights map",
    "MistralForCausalLM": "its MLP is gated (SiLU(gate_proj) * up_proj), `standard`'s a plain GELU one: no weights map",
    "Qwen2ForCausalLM": "its MLP is gated and its attention has biases, `standard` has neither: no weights map",
}


def hf_problem(hf: dict[str, Any], shape: ModelShape, norm_eps: float, rope_base: float) -> str | None:
    """Why a Hugging Face config does not describe this `standard` model exactly (None: it does)."""
    arch = (hf.get("architectures") or [None])[0]
    if arch in NOT_STANDARD:
        return f"{arch}: {NOT_STANDARD[arch]}"
    if arch != ARCHITECTURE:
        return f"architecture {arch!r} has no mapping onto `standard` (only {ARCHITECTURE} does)"
    if shape.pos != "rope":
        return f"{ARCHITECTURE} uses RoPE: set model.pos=rope"
    want = {"hidden_size": shape.d_model, "num_hidden_layers": shape.n_layers, "num_attention_heads": shape.n_heads,
            "num_key_value_heads": shape.n_heads, "intermediate_size": shape.d_ff, "vocab_size": shape.vocab_size,
            "head_dim": shape.head_dim, "hidden_act": "gelu", "attention_bias": False, "mlp_bias": False,
            "tie_word_embeddings": True, "rms_norm_eps": norm_eps, "rope_theta": rope_base, "rope_scaling": None}
    for key, value in want.items():
        got = hf.get(key, value if key in ("head_dim", "rope_scaling") else None)
        if key == "num_key_value_heads" and got is None:
            got = hf.get("num_attention_heads")
        if got != value:
            return f"config.json {key} is {got!r}, this run's model needs {value!r}"
    return None


def from_hf(hf_sd: dict[str, torch.Tensor], shape: ModelShape) -> dict[str, torch.Tensor]:
    """`to_hf` undone: a `standard` Transformer's state dict from Arcee's tensors (the LM head tied: an
    `lm_head.weight` there must equal the embedding). A missing or misshapen tensor is a KeyError / ValueError
    naming it."""
    d, h = shape.d_model, shape.n_heads
    head = hf_sd.get("lm_head.weight")
    if head is not None and not torch.equal(head, hf_sd["model.embed_tokens.weight"]):
        raise ValueError("lm_head.weight differs from model.embed_tokens.weight (`standard` ties them)")
    out = {"tok_emb.weight": hf_sd["model.embed_tokens.weight"], "stream.norm.weight": hf_sd["model.norm.weight"]}
    for i in range(shape.n_layers):
        src, dst = f"model.layers.{i}.", f"blocks.{i}."
        q = halves_to_interleaved(hf_sd[src + "self_attn.q_proj.weight"], h)
        k = halves_to_interleaved(hf_sd[src + "self_attn.k_proj.weight"], h)
        v = hf_sd[src + "self_attn.v_proj.weight"]
        if not (q.shape == k.shape == v.shape == (d, d)):
            raise ValueError(f"{src}self_attn: the projections are not ({d}, {d})")
        out.update({
            dst + "attn_site.norm.weight": hf_sd[src + "input_layernorm.weight"],
            dst + "attn.qkv.weight": torch.cat([q, k, v], dim=0),
            dst + "attn.proj.weight": hf_sd[src + "self_attn.o_proj.weight"],
            dst + "mlp_site.norm.weight": hf_sd[src + "post_attention_layernorm.weight"],
            dst + "mlp.fc.weight": hf_sd[src + "mlp.up_proj.weight"],
            dst + "mlp.proj.weight": hf_sd[src + "mlp.down_proj.weight"],
        })
    used = {"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"} | {
        f"model.layers.{i}.{n}" for i in range(shape.n_layers) for n in (
            "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
            "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")}
    extra = sorted(k for k in hf_sd if k not in used and not k.endswith("rotary_emb.inv_freq"))
    if extra:
        raise ValueError(f"{extra[0]} has no place in `standard`")
    return out
