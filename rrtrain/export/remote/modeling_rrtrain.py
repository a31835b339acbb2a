"""An rrtrain model as a transformers causal LM (loaded with `trust_remote_code=True`).

The model itself is rrtrain's own `Transformer`, from rrtrain's model package copied beside this file at export
time (rrtrain/model/ and rrtrain/residuals/ as they are), with the residual rule config.json names, found among
the built-in rules (`builtin.py`); this wrapper only adapts the calling convention:
`forward(input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None, labels=None)`
returns logits (and the mean next-token loss when labels are given, transformers' convention: labels are the
inputs, shifted here, -100 ignored).

What the model package does with them (rrtrain/model/transformer.py, `Attend`): padded positions (left or right)
are neither attended to nor attend to real tokens, and positions count from each row's first real token, so a
padded row gives the logits of its unpadded tokens; attention keys and values are cached in a `DynamicCache`
(every residual rule acts on each position alone, so attention is all there is to cache); a sequence longer than
`max_position_embeddings` (the run's seq_len) is a ValueError that names both lengths. `token_type_ids`, which
some tokenizers return, are accepted and ignored.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from transformers import DynamicCache, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .builtin import SPECS
from .configuration_rrtrain import RrtrainConfig
from .spec import ModelSpec
from .transformer import Transformer

# rrtrain export writes here one import of each file of the copied package: transformers copies a local
# directory's remote code into its module cache only as far as the modeling file's own relative imports reach.
# COPIED-MODULES


class RrtrainForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = RrtrainConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _supports_cache_class = True  # a DynamicCache; not a static one (its keys are padded to a fixed length)
    _supports_static_cache = False

    def __init__(self, config: RrtrainConfig) -> None:
        super().__init__(config)
        self.model = Transformer(ModelSpec.from_dict(config.rrtrain, SPECS), seed=None)
        self.post_init()

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: every tensor comes from model.safetensors (and the rotary tables are rebuilt by the model)."""

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.tok_emb

    def set_input_embeddings(self, value: torch.nn.Module) -> None:
        self.model.tok_emb = value

    def get_output_embeddings(self) -> None:
        return None  # the LM head is the token embedding itself (rrtrain ties them in its forward)

    def forward(self, input_ids: torch.LongTensor, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.LongTensor] = None, past_key_values: Optional[Any] = None,
                use_cache: Optional[bool] = None, labels: Optional[torch.LongTensor] = None,
                token_type_ids: Optional[torch.Tensor] = None, **kwargs: Any) -> CausalLMOutputWithPast:
        """`token_type_ids` are ignored (the model has one segment); other transformers keyword arguments
        (`cache_position`, `return_dict`, ...) likewise: the cache's own length gives the positions. A cache is
        kept when one is given or `use_cache` (generate passes it); a plain forward keeps none."""
        cache = past_key_values
        if cache is not None and not isinstance(cache, DynamicCache):
            raise ValueError(f"rrtrain models take a DynamicCache (generate's default), got {type(cache).__name__}")
        use_cache = cache is not None if use_cache is None else use_cache
        if cache is None and use_cache:
            cache = DynamicCache()
        mask = attention_mask
        if mask is not None and bool(mask.all()):
            mask = None  # nothing padded: plain causal attention
        logits = self.model(input_ids, attention_mask=mask, position_ids=position_ids, cache=cache)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache if use_cache else None)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, past_key_values: Optional[Any] = None,
                                      attention_mask: Optional[torch.Tensor] = None, use_cache: Optional[bool] = None,
                                      **kwargs: Any) -> dict[str, Any]:
        """The tokens the cache has not seen yet, the mask over all of them (positions come from it)."""
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        return {"input_ids": input_ids[:, past:], "attention_mask": attention_mask,
                "past_key_values": past_key_values, "use_cache": use_cache}
