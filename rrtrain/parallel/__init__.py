"""Parallelism backends behind one small interface (`Engine`), so the training loop never branches on them.

`build_engine(model, cfg, dist_info, ...)` applies, in this fixed order: activation checkpointing ->
torch.compile -> sharding (FSDP2) or the DeepSpeed engine, and returns an Engine that owns backward,
gradient clipping, the optimizer step and checkpoint state. A model built on the meta device (training's
path) is materialised after sharding, each rank's shards initialised unit by unit (`materialize.py`).
"""

from __future__ import annotations

from rrtrain.parallel.engine import Engine, build_engine, build_training_engine

__all__ = ["Engine", "build_engine", "build_training_engine"]
