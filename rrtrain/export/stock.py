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

from rrtrain.artifact.stock import (  # noqa: F401  (the adapter, both ways: rrtrain/artifact/stock.py)
    ARCHITECTURE,
    from_hf,
    interleaved_to_halves,
    state_dict,
    stock_problem,
    to_hf,
)
from rrtrain.core.errors import UsageError
from rrtrain.sizing import ModelShape


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


__all__ = ["ARCHITECTURE", "config", "from_hf", "interleaved_to_halves", "state_dict", "stock_problem", "to_hf"]
