"""Measure one rank's peak tensor memory over two training steps of the real model and engine.

Run as `python -m tests.distributed.plan_peak_worker OUT.json CASES.json` on each rank of an env:// launch (FSDP2 on
gloo; tests/distributed/rankutil.py), or call `peaks` in one process. CASES.json maps a name to a list of config overrides (model.*, train.micro_batch, parallel.*); each case is
measured in turn in the same process. Memory is counted by torch's MemTracker, which sees every tensor
the step allocates (parameters, gradients, optimizer state, activations, all-gather buffers) on the CPU;
rank 0 writes {name: peak bytes} as JSON.
"""

from __future__ import annotations

import json
import sys

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from rrtrain.core import dist
from rrtrain.config import Config
from rrtrain.config_load import apply_overrides, build
from rrtrain.resolve import build_model
from rrtrain.parallel import build_engine


def peak_bytes(overrides: list[str], info: dist.DistInfo) -> int:
    cfg: Config = build(Config, apply_overrides({}, overrides))
    tracker = MemTracker()
    with tracker:
        model = build_model(cfg.model, device="meta")  # as training builds it: the engine materialises it
        engine = build_engine(model, cfg, info)
        vocab, t = model.shape.vocab_size, model.shape.seq_len
        gen = torch.Generator().manual_seed(info.rank)
        for step in range(2):
            if step:
                tracker.reset_mod_stats()  # per-module stats are per iteration; the peak is kept
            batch = torch.randint(0, vocab, (cfg.train.micro_batch, t + 1), generator=gen)
            loss = engine.forward(batch[:, :-1], batch[:, 1:])
            engine.backward(loss, last_micro=True)
            engine.clip_grad_norm(1.0)
            engine.step(1e-3)
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def peaks(cases: dict[str, list[str]], info: dist.DistInfo) -> dict[str, int]:
    """{name: peak bytes} of each case in turn (a collective under a process group)."""
    return {name: peak_bytes(overrides, info) for name, overrides in cases.items()}


def main(out: str, cases_path: str) -> None:
    with open(cases_path) as f:
        cases: dict[str, list[str]] = json.load(f)
    info = dist.setup(600)
    measured = peaks(cases, info)
    if info.is_main:
        with open(out, "w") as f:
            json.dump(measured, f)
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    dist.exit_process(0)
