"""`standard` as a stock transformers architecture, loaded without remote code: Arcee (`ArceeForCausalLM`).

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

from rrtrain.core.errors import UsageError
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


def state_dict(sd: dict[str, torch.Tensor], shape: ModelShape) -> dict[str, torch.Tensor]:
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


def config(shape: ModelShape, norm_eps: float, rope_base: float, eos_id: int, pad_id: int | None,
           dtype: torch.dtype) -> Any:
    """The ArceeConfig of this shape."""
    try:
        from transformers import ArceeConfig
    except ImportError:
        raise UsageError("--stock needs transformers >= 4.53 (Arcee); pip install -U 'rrtrain[eval]'") from None
    return ArceeConfig(
        vocab_size=shape.vocab_size, hidden_size=shape.d_model, intermediate_size=shape.d_ff,
        num_hidden_layers=shape.n_layers, num_attention_heads=shape.n_heads, num_key_value_heads=shape.n_heads,
        head_dim=shape.head_dim, hidden_act="gelu", max_position_embeddings=shape.seq_len, rms_norm_eps=norm_eps,
        rope_theta=rope_base, rope_scaling=None, attention_bias=False, mlp_bias=False, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id, use_cache=True, torch_dtype=dtype,
        architectures=[ARCHITECTURE])
