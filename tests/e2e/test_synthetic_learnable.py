"""The built-in synthetic corpus is real work: a `tiny` model's held-out loss falls well below the unigram
entropy (the best any context-free model can do) within a few hundred steps, and is still falling. Measured: at
step 120 the loss is ~0.8 nats below the bound asserted (entropy - 1) and fell ~1.1 nats since step 60."""

from __future__ import annotations

import math
import time

import pytest
import torch

from data_prep.cli import main as prep_main
from rrtrain.config import ModelConfig
from rrtrain.data.loader import TrainLoader, eval_batches, read_manifest
from rrtrain.resolve import build_model

STEPS, MICRO, SEQ = 120, 16, 64


@torch.no_grad()
def _val_loss(model: torch.nn.Module, batches: list[torch.Tensor]) -> float:
    model.eval()
    losses = [model(b[:, :-1], b[:, 1:]).item() for b in batches]
    model.train()
    return sum(losses) / len(losses)


@pytest.mark.slow
def test_tiny_model_beats_the_unigram_entropy_by_a_wide_margin(tmp_path):
    data = tmp_path / "stories"
    assert prep_main(["--source", "synthetic:stories", "--num-docs", "2500", "--tokenizer", "bpe:1024",
                      "--seq-len", str(SEQ), "--out", str(data), "--min-val-samples", "64", "--quiet"]) == 0
    man = read_manifest(str(data))
    entropy = man["unigram_entropy"]
    assert 4.0 < entropy < math.log(man["vocab_size"])  # a bpe vocabulary used broadly, not a toy

    torch.manual_seed(0)
    model = build_model(ModelConfig(size="tiny", variant="standard", vocab_size=man["vocab_size"], seq_len=SEQ))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    loader = TrainLoader(str(data), micro_batch=MICRO, global_batch=MICRO, rank=0, world_size=1, local_rank=0,
                         seed=0, cache_dir=str(tmp_path / "cache"))
    val = eval_batches(str(data), micro_batch=MICRO, n_batches=4, rank=0, world_size=1, cache_dir=str(tmp_path / "cache"))
    it = iter(loader)
    curve = {0: _val_loss(model, val)}
    t0 = time.monotonic()
    for step in range(1, STEPS + 1):
        batch = next(it)
        loss = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step in (STEPS // 2, STEPS):
            curve[step] = _val_loss(model, val)
    loader.close()
    elapsed = time.monotonic() - t0
    print(f"unigram entropy {entropy:.3f} nats; val loss {curve} in {elapsed:.1f} s")
    assert curve[0] > entropy  # an untrained model is worse than unigram
    assert curve[STEPS] < entropy - 1.0, (curve, entropy)  # clearly below: it learned context, not frequencies
    assert curve[STEPS] < curve[STEPS // 2] - 0.05, curve  # and it keeps falling
