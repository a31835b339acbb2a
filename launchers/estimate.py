"""What a run costs before it is submitted: its parameters and training FLOPs (rrtrain.model.sizing, with the same
matching the trainer applies) and GPU-hours at an assumed MFU on a named GPU's peak."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from launchers.expand import Run
from rrtrain.config import Config, build
from rrtrain.core.errors import UsageError
from rrtrain.core.hardware import GPU_PEAK_TFLOPS, precision_key


@dataclass(frozen=True)
class Cost:
    params: int
    tokens: int
    flops: float
    gpu_hours: Optional[float]  # None for CPU runs


def check_gpu(name: str) -> None:
    if name not in GPU_PEAK_TFLOPS:
        raise UsageError(f"gpu: unknown GPU '{name}'; known: {', '.join(GPU_PEAK_TFLOPS)}")


def _dataset(path: Optional[str]) -> tuple[Optional[int], Optional[int]]:
    try:
        m = json.loads((Path(path) / "manifest.json").read_text()) if path else {}
    except (OSError, ValueError):
        m = {}
    return m.get("vocab_size"), m.get("seq_len")


def cost(run: Run, gpu: str, mfu: float) -> Cost:
    from rrtrain.model import sizing
    from rrtrain.training.trainer import resolve_model_shape

    cfg: Config = build(Config, run.config)
    vocab, seq_len = _dataset(cfg.data.path)
    shape = resolve_model_shape(cfg, vocab, seq_len)
    t = cfg.train
    tokens = t.max_steps * t.global_batch * shape.seq_len if t.max_steps is not None else int(t.tokens or 0)
    flops = sizing.flops_per_token(shape, cfg.model.variant, cfg.model.residual) * tokens
    params = sizing.count_params(shape, cfg.model.variant, cfg.model.residual)
    hours = None
    if run.resources.gpus_per_node:
        peak = GPU_PEAK_TFLOPS[gpu][precision_key(cfg.parallel.precision)] * 1e12
        hours = flops / (peak * mfu) / 3600.0
    return Cost(params, tokens, flops, hours)
