"""`parallel.backend` to an Engine: the one place that knows every backend, so no backend imports another."""

from __future__ import annotations

from typing import Optional

from rrtrain.config import Config
from rrtrain.core.dist import DistInfo
from rrtrain.model.transformer import Transformer
from rrtrain.parallel.deepspeed import DeepSpeedEngine  # light: `deepspeed` itself is imported by the engine
from rrtrain.parallel.engine import Engine
from rrtrain.parallel.fsdp import FSDPEngine
from rrtrain.parallel.local import LocalEngine
from rrtrain.residuals import RuleSpec
from rrtrain.resolve import build_model
from rrtrain.sizing import ModelShape


def build_engine(model: Transformer, cfg: Config, info: DistInfo) -> Engine:
    """The backend `parallel.backend` names, around `model` (built on meta, or with its weights)."""
    backend = cfg.parallel.backend
    if backend == "deepspeed":
        return DeepSpeedEngine(model, cfg, info)
    if backend == "fsdp":
        return FSDPEngine(model, cfg, info)
    return LocalEngine(model, cfg, info)


def build_training_engine(cfg: Config, shape: ModelShape, info: DistInfo, rule: Optional[RuleSpec] = None) -> Engine:
    """The engine as training builds it, for the trainer and `rrtrain bench` alike: the model on the meta device,
    sharded by the engine, then each rank's part materialised and initialised from `train.seed`. `shape` and
    `rule` are the resolved run's (rrtrain.resolve)."""
    return build_engine(build_model(cfg.model, shape=shape, device="meta", rule=rule), cfg, info)
