"""`parallel.backend: none`: one process, a plain module, bf16 by autocast where `parallel.precision` asks."""

from __future__ import annotations

import contextlib

import torch

from rrtrain.config import Config
from rrtrain.core.dist import DistInfo
from rrtrain.model.transformer import Transformer
from rrtrain.parallel.materialize import place
from rrtrain.parallel.native import NativeEngine
from rrtrain.parallel.prepare import prepare_blocks


class LocalEngine(NativeEngine):
    """The model as it is, on this process's device; a meta-built one is materialised here."""

    def __init__(self, model: Transformer, cfg: Config, info: DistInfo) -> None:
        prepare_blocks(model, cfg)
        self.bf16_autocast = cfg.parallel.precision == "bf16"
        place(model, info.device, cfg.train.seed)
        super().__init__(model, cfg, info.device)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.bf16_autocast:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()
