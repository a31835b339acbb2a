"""The review gate in eager mode: as written (W applied block by block to factored norms) against the
concatenated form it replaced (the oracle of tests/unit/test_gate_oracle.py), both against `standard`.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks/bench_gate.py   (or `make bench`)

In one process, one thread: forward + backward of the whole model on one random batch, the three models
alternating (standard, review, review-oracle, then the reverse order), median process CPU time per step
after 3 warm-up steps. The oracle model is the same review model with `write` swapped for the oracle.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from rrtrain.config import ModelConfig, ResidualConfig
from rrtrain.model import build_model
from rrtrain.residuals.single import GatedSite
from unit.test_gate_oracle import oracle_write


def step_times(d: int, blocks: int, seq: int, batch: int, rounds: int) -> dict[str, float]:
    torch.set_num_threads(1)

    def model(variant: str) -> torch.nn.Module:
        torch.manual_seed(0)
        return build_model(ModelConfig(size="tiny", variant=variant, d_model=d, n_layers=blocks, n_heads=4,
                                       d_ff=4 * d, seq_len=seq, vocab_size=256, residual=ResidualConfig()))

    models = {"standard": model("standard"), "review": model("review"), "review (oracle)": model("review")}
    idx = torch.randint(0, 256, (batch, seq + 1))
    written = GatedSite.write
    times: dict[str, list[float]] = {k: [] for k in models}
    try:
        for i in range(rounds):
            for name in list(models) if i % 2 == 0 else list(models)[::-1]:
                GatedSite.write = (lambda self, s, y, ctx: oracle_write(self, s, y)) if "oracle" in name else written
                t0 = time.process_time()
                models[name](idx[:, :-1], idx[:, 1:]).backward()
                times[name].append(time.process_time() - t0)
    finally:
        GatedSite.write = written
    return {k: statistics.median(v[3:]) for k, v in times.items()}


@pytest.mark.parametrize("d,blocks,seq,batch,rounds", [(64, 20, 64, 8, 30), (384, 4, 256, 4, 12)])
def test_gate_as_written_against_the_concatenated_form(d, blocks, seq, batch, rounds):
    t = step_times(d, blocks, seq, batch, rounds)
    print(f"\nd={d}, {blocks} blocks, seq {seq}, batch {batch}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in t.items())
          + f"; review/standard {t['review'] / t['standard']:.3f}, oracle/standard {t['review (oracle)'] / t['standard']:.3f}")
