"""The configuration of a model exported by `rrtrain export --hf`: transformers' usual fields, read by tools
such as lm-evaluation-harness (vocabulary, width, depth, heads, maximum length), and under `rrtrain` everything
the copied rrtrain package needs to rebuild the model exactly (rrtrain/model/spec.py, `ModelSpec.to_dict`): the
residual rule, the resolved shape, the rule's knobs and the norm, init and RoPE settings."""

from __future__ import annotations

from typing import Any, Optional

from transformers import PretrainedConfig


class RrtrainConfig(PretrainedConfig):
    model_type = "rrtrain"

    def __init__(self, rrtrain: Optional[dict[str, Any]] = None, tie_word_embeddings: bool = True,
                 **kwargs: Any) -> None:
        self.rrtrain = dict(rrtrain or {})
        shape = self.rrtrain.get("shape", {})
        # the names transformers and its users look for, derived from the shape (never set independently)
        self.vocab_size = shape.get("vocab_size", kwargs.pop("vocab_size", None))
        self.hidden_size = shape.get("d_model", kwargs.pop("hidden_size", None))
        self.num_hidden_layers = shape.get("n_layers", kwargs.pop("num_hidden_layers", None))
        self.num_attention_heads = shape.get("n_heads", kwargs.pop("num_attention_heads", None))
        self.intermediate_size = shape.get("d_ff", kwargs.pop("intermediate_size", None))
        self.max_position_embeddings = shape.get("seq_len", kwargs.pop("max_position_embeddings", None))
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "max_position_embeddings"):
            kwargs.pop(key, None)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
