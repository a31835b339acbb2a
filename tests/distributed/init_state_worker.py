"""Write the full model state at step 0, as training builds it (meta -> engine -> materialised shards).

Run as `python -m tests.distributed.init_state_worker OUT_DIR VARIANTS LAYOUTS.json` on each rank of an env://
launch (tests/distributed/rankutil.py), or call `initial_state` in one process. LAYOUTS.json maps a layout's name
to its config overrides (every layout of one launch has its world size); for each layout in turn, and each model
variant in the comma-separated VARIANTS in turn, in this process, rank 0 keeps every parameter and buffer whole
({"variant/name": tensor}), gathered from this layout's shards before any step, and the names the optimizer
excludes from weight decay (decided on the built parameters, which ZeRO-3 holds partitioned), and writes them to
OUT_DIR/NAME.pt.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from rrtrain.core import dist
from rrtrain.config import Config
from rrtrain.config_load import apply_overrides, build
from rrtrain.resolve import build_model
from rrtrain.parallel.adamw import no_decay_names
from rrtrain.parallel import Engine, build_engine


def full_state(engine: Engine) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of the unwrapped model, whole, on the CPU (a collective)."""
    model = engine.inner
    named = [*model.named_parameters(), *model.named_buffers()]
    if getattr(engine, "stage", None) == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            return {n: t.detach().cpu().clone() for n, t in named}
    return {n: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone() for n, t in named}


def initial_state(variants: list[str], overrides: list[str], info: dist.DistInfo) -> dict:
    """{"tensors": {"variant/name": full tensor}, "no_decay": {variant: names}} on this layout (a collective)."""
    tensors: dict[str, torch.Tensor] = {}
    no_decay: dict[str, list[str]] = {}
    for variant in variants:
        cfg: Config = build(Config, apply_overrides({}, [*overrides, f"model.variant={variant}",
                                                         "train.compile=false"]))
        engine = build_engine(build_model(cfg.model, device="meta"), cfg, info)
        tensors.update({f"{variant}/{n}": t for n, t in full_state(engine).items()})
        no_decay[variant] = sorted(no_decay_names(engine.inner))
    return {"tensors": tensors, "no_decay": no_decay}


def main() -> None:
    out, variants = Path(sys.argv[1]), sys.argv[2].split(",")
    layouts: dict[str, list[str]] = json.loads(Path(sys.argv[3]).read_text())
    info = dist.setup(120)
    for name, overrides in layouts.items():
        state = initial_state(variants, overrides, info)
        if info.is_main:
            torch.save(state, out / f"{name}.pt")
    dist.barrier()


if __name__ == "__main__":
    main()
    dist.exit_process(0)
