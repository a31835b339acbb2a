"""`rrtrain export --stock`'s config: `standard` as transformers' `ArceeForCausalLM`, loaded without remote code.
The weights' mapping both ways, and why Arcee is `standard` exactly, are rrtrain/artifact/stock.py's."""

from __future__ import annotations

from typing import Any

import torch

from rrtrain.artifact.stock import ARCHITECTURE
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


