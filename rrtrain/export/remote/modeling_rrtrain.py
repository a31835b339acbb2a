"""An rrtrain model as a transformers causal LM (loaded with `trust_remote_code=True`).

The model itself is rrtrain's own `Transformer`, from the source copied beside this file at export time, with
the residual rule the run trained with (`exported_rule.py`); this wrapper only adapts the calling convention:
`forward(input_ids, attention_mask=None, labels=None)` returns logits (and the mean next-token loss when labels
are given, transformers' convention: labels are the inputs, shifted here, -100 ignored).

The model has no key/value cache and no padding mask: a sequence is computed whole, causally, so right padding
(what lm-evaluation-harness uses) leaves the real tokens' logits as they are; left padding is refused.
Sequences are at most `max_position_embeddings` (the run's seq_len) long.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_rrtrain import RrtrainConfig
from .exported_rule import SPEC
from .rrtrain_shim import ResidualConfig
from .sizing import ModelShape
from .transformer import Transformer

# rrtrain export writes here one import of each module of the copied source: transformers copies a local
# directory's remote code into its module cache only as far as the modeling file's own relative imports reach.
# BUNDLED-IMPORTS


class RrtrainForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = RrtrainConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]
    _supports_cache_class = False

    def __init__(self, config: RrtrainConfig) -> None:
        super().__init__(config)
        r = config.rrtrain
        if r.get("variant") != SPEC.name:
            raise ValueError(f"config.json names residual rule {r.get('variant')!r}; this export's source holds "
                             f"{SPEC.name!r}")
        self.model = Transformer(ModelShape(**r["shape"]), SPEC, ResidualConfig(**r["residual"]), r["norm_eps"],
                                 r["init_std"], r["rope_base"], seed=None)
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
                labels: Optional[torch.LongTensor] = None, **kwargs: Any) -> CausalLMOutputWithPast:
        if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape[1] > 1:
            if bool((attention_mask[:, 1:] > attention_mask[:, :-1]).any()):
                raise ValueError("rrtrain models take right padding only (a padded position before a real token)")
        logits = self.model(input_ids)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=None)

    def prepare_inputs_for_generation(self, input_ids: torch.LongTensor, **kwargs: Any) -> dict[str, Any]:
        """No cache: every generation step recomputes the whole sequence."""
        return {"input_ids": input_ids}
