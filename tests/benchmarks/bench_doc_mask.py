"""Document masking's cost on CPU: the training step with `model.doc_mask` (a boolean block-diagonal causal mask
per row given to scaled_dot_product_attention, positions restarting per document) against the unmasked step
(`is_causal=True`), the same weights and batch.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks/bench_doc_mask.py   (or `make bench`)

In one process, one thread: forward + backward of the whole model on one batch of packed rows (documents of
random length, mean seq_len / 4, each ending in the end-of-document token), the two models alternating (unmasked,
masked, then the reverse order), median process CPU time per step after 3 warm-up steps. Eager, as tests and
short runs train (`train.compile` "auto" compiles from 10,000 CPU steps on); and the tiny shape with every block
compiled, as `train.compile` compiles them (the compile itself falls in the warm-up steps, outside the medians).
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from rrtrain.config import ModelConfig
from rrtrain.resolve import build_model

EOD = 0


def packed_rows(batch: int, seq: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Rows of seq + 1 tokens: documents of geometric length (mean seq / 4), each ending in EOD."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(1, vocab, (batch, seq + 1), generator=g)
    idx[torch.rand(batch, seq + 1, generator=g) < 4 / seq] = EOD
    return idx


def step_times(d: int, blocks: int, seq: int, batch: int, vocab: int, pos: str, rounds: int,
               compiled: bool = False) -> dict[str, float]:
    torch.set_num_threads(1)

    def model(doc_mask: bool) -> torch.nn.Module:
        m = build_model(ModelConfig(size="tiny", d_model=d, n_layers=blocks, n_heads=4, d_ff=4 * d, seq_len=seq,
                                    vocab_size=vocab, pos=pos, doc_mask=doc_mask,
                                    eod_id=EOD if doc_mask else None), seed=0)
        if compiled:  # as `train.compile` does (rrtrain/parallel/prepare.py): each block
            for block in m.blocks:
                block.compile()
        return m

    models = {"unmasked": model(False), "doc_mask": model(True)}
    idx = packed_rows(batch, seq, vocab)
    times: dict[str, list[float]] = {k: [] for k in models}
    for i in range(rounds):
        for name in list(models) if i % 2 == 0 else list(models)[::-1]:
            t0 = time.process_time()
            models[name](idx[:, :-1], idx[:, 1:]).backward()
            times[name].append(time.process_time() - t0)
    return {k: statistics.median(v[3:]) for k, v in times.items()}


@pytest.mark.parametrize("d,blocks,seq,batch,vocab,pos,rounds", [
    (64, 4, 128, 8, 258, "learned", 40),  # the trainer's tiny (byte vocabulary)
    (64, 4, 512, 8, 258, "rope", 20),  # the same at a longer context: the mask is seq^2 per row
    (384, 4, 256, 4, 8192, "rope", 12),  # ~20M
])
def test_doc_mask_against_the_unmasked_step(d, blocks, seq, batch, vocab, pos, rounds):
    t = step_times(d, blocks, seq, batch, vocab, pos, rounds)
    print(f"\nd={d}, {blocks} blocks, seq {seq}, batch {batch}, vocab {vocab}, {pos}: unmasked "
          f"{t['unmasked'] * 1e3:.1f} ms, doc_mask {t['doc_mask'] * 1e3:.1f} ms, ratio "
          f"{t['doc_mask'] / t['unmasked']:.3f}")


def test_doc_mask_against_the_unmasked_step_compiled():
    from rrtrain.parallel.compile_policy import unavailable_reason

    reason = unavailable_reason(torch.device("cpu"))
    if reason:
        pytest.skip(reason)
    t = step_times(64, 4, 128, 8, 258, "learned", 30, compiled=True)
    print(f"\ncompiled blocks, d=64, 4 blocks, seq 128, batch 8, vocab 258, learned: unmasked "
          f"{t['unmasked'] * 1e3:.1f} ms, doc_mask {t['doc_mask'] * 1e3:.1f} ms, ratio "
          f"{t['doc_mask'] / t['unmasked']:.3f}")
