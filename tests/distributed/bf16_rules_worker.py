"""Optimizer steps of several rules in bf16, every rule in turn in one job (or in the test's own process).

Run as `python -m tests.distributed.bf16_rules_worker OUT.json CASES.json STEPS` on each rank of an env:// launch
(FSDP2 on gloo; tests/distributed/rankutil.py), or call `run_cases` in one process (`parallel.backend=none`,
autocast). CASES.json maps a label to a list of config overrides (the rule, its knobs, `parallel.*`, the batch).
Each rule's engine is built as training builds it (the model on the meta device, then sharded and materialised by
the engine: `build_engine`) and stepped by the trainer's own optimizer step (`rrtrain.training.step.optimizer_step`:
micro-batches, gradient accumulation, the all-reduced loss, clipping, AdamW, the rule's after-step hook) at the
trainer's learning-rate schedule, on the byte-level synthetic stories (rows of 65 tokens, each rank its own).
Rank 0 writes {label: {"losses": [...], "skipped": [...]}}: the loss of every step, and 1.0 where a step was
skipped as non-finite.
"""

from __future__ import annotations

import json
import sys

import torch

from rrtrain import schedule
from rrtrain.config import Config
from rrtrain.config_load import apply_overrides, build
from rrtrain.core import dist
from rrtrain.parallel import build_engine
from rrtrain.planning.depth_data import story_rows
from rrtrain.resolve import build_model
from rrtrain.training.step import grad_accumulation, optimizer_step

SEQ = 64
#: a small model (d_model 32, 2 blocks, 2 heads) on byte-level text, eager, the tiny preset's learning rate; a case
#: adds its rule, its parallelism and its batch
BASE = ["model.size=tiny", "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.vocab_size=258",
        f"model.seq_len={SEQ}", "train.lr=0.003", "train.warmup_steps=2", "train.compile=false"]


def rule_steps(overrides: list[str], rows: torch.Tensor, steps: int, info: dist.DistInfo) -> dict[str, list[float]]:
    cfg: Config = build(Config, apply_overrides({}, [*BASE, *overrides, f"train.max_steps={steps}"]))
    torch.manual_seed(cfg.train.seed)
    engine = build_engine(build_model(cfg.model, device="meta"), cfg, info)
    t = cfg.train
    accum = grad_accumulation(t, info.world_size)
    mine = rows[info.rank::info.world_size]
    batches = (mine[i * t.micro_batch:(i + 1) * t.micro_batch] for i in range(steps * accum))
    losses, skipped = [], []
    for step in range(steps):
        out = optimizer_step(engine, batches, accum, schedule.lr_at(step, steps, t.warmup_steps, t), t.grad_clip,
                             info)
        losses.append(float(out.loss))
        skipped.append(float(out.nonfinite))
    return {"losses": losses, "skipped": skipped}


def run_cases(cases: dict[str, list[str]], steps: int, info: dist.DistInfo) -> dict[str, dict[str, list[float]]]:
    """{label: {"losses", "skipped"}} of each case in turn (collectives under a process group)."""
    rows = torch.from_numpy(story_rows(400, "byte", SEQ, val_rows=1).train)
    return {label: rule_steps(overrides, rows, steps, info) for label, overrides in cases.items()}


def main(out: str, cases_path: str, steps: str) -> None:
    with open(cases_path) as f:
        cases: dict[str, list[str]] = json.load(f)
    info = dist.setup(600)
    result = run_cases(cases, int(steps), info)
    if info.is_main:
        with open(out, "w") as f:
            json.dump(result, f)
    dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
    dist.exit_process(0)
