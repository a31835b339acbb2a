"""Parallelism backends behind one small interface (`Engine`), so the training loop never branches on them.

`build_engine(model, cfg, dist_info)` picks the backend `parallel.backend` names and returns an Engine that owns
backward, gradient clipping, the optimizer step and checkpoint state. Every backend first prepares the blocks
the same way (`prepare.py`: activation checkpointing, then torch.compile), then wraps: nothing (`local.py`),
FSDP2/HSDP (`fsdp.py`) or DeepSpeed ZeRO (`deepspeed.py`); all build AdamW in `adamw.py`. A model built on the
meta device (training's path) is materialised after sharding, each rank's shards initialised unit by unit
(`materialize.py`). The interface is `engine.py`, the dispatch `build.py`; no backend imports another.
`memory.py` predicts what each backend holds per rank (`rrtrain plan`), and `auto_batch.py` sizes
`train.micro_batch: auto` from it; both build nothing.
"""

from __future__ import annotations

from rrtrain.parallel.build import build_engine, build_training_engine
from rrtrain.parallel.engine import Engine

__all__ = ["Engine", "build_engine", "build_training_engine"]
