"""The review gate in eager mode: as written (W applied block by block to factored norms, gate and merge one
autograd function with a hand-written backward) against the same factored form differentiated by autograd
(the implementation before the hand-written backward) and the concatenated form (the oracle of
tests/unit/rrtrain/residuals/test_gate_oracle.py), all against `standard`.

Run:  .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/benchmarks/bench_gate.py   (or `make bench`)

In one process, one thread: forward + backward of the whole model on one random batch, the four models
alternating (standard, review, review by autograd, review-oracle, then the reverse order), median process
CPU time per step after 3 warm-up steps. The reference models are the same review model with `write`
swapped for the reference.
"""

from __future__ import annotations

import math
import statistics
import time

import pytest
import torch
import torch.nn.functional as F

from rrtrain.config import ModelConfig
from rrtrain.resolve import build_model
from rrtrain.residuals.norm import inv_rms
from rrtrain.residuals.single import GatedSite
from unit.rrtrain.residuals.test_gate_oracle import oracle_write


def autograd_write(site: GatedSite, state: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The factored full-rank gate and its merge as plain operators, differentiated by autograd."""
    root_d = math.sqrt(state.shape[-1])
    inputs = [(state, site.gate_norm_h)] + ([(y, site.gate_norm_u)] if site.gate_norm_u is not None else [])
    weight = site.gate.proj.weight * torch.cat([norm.gain() * root_d for _, norm in inputs])
    acc = site.gate.bias
    for (x, norm), block in zip(inputs, weight.split(state.shape[-1], dim=1)):
        acc = torch.addcmul(acc, F.linear(x, block), inv_rms(x, norm.eps))
    return torch.addcmul(state, torch.sigmoid(acc), y - state if site.convex else y)


REFERENCES = {"review (autograd)": autograd_write, "review (oracle)": oracle_write}


def step_times(d: int, blocks: int, seq: int, batch: int, rounds: int) -> dict[str, float]:
    torch.set_num_threads(1)

    def model(variant: str) -> torch.nn.Module:
        torch.manual_seed(0)
        return build_model(ModelConfig(size="tiny", variant=variant, d_model=d, n_layers=blocks, n_heads=4,
                                       d_ff=4 * d, seq_len=seq, vocab_size=256, residual=dict()))

    models = {"standard": model("standard"), "review": model("review"), **{k: model("review") for k in REFERENCES}}
    idx = torch.randint(0, 256, (batch, seq + 1))
    written = GatedSite.write
    times: dict[str, list[float]] = {k: [] for k in models}
    try:
        for i in range(rounds):
            for name in list(models) if i % 2 == 0 else list(models)[::-1]:
                ref = REFERENCES.get(name)
                GatedSite.write = (lambda self, s, y, ctx, ref=ref: ref(self, s, y)) if ref else written
                t0 = time.process_time()
                models[name](idx[:, :-1], idx[:, 1:]).backward()
                times[name].append(time.process_time() - t0)
    finally:
        GatedSite.write = written
    return {k: statistics.median(v[3:]) for k, v in times.items()}


@pytest.mark.parametrize("d,blocks,seq,batch,rounds", [(64, 4, 64, 16, 60), (64, 20, 64, 8, 30), (384, 4, 256, 4, 12)])
def test_gate_as_written_against_its_references(d, blocks, seq, batch, rounds):
    t = step_times(d, blocks, seq, batch, rounds)
    print(f"\nd={d}, {blocks} blocks, seq {seq}, batch {batch}: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in t.items())
          + "; over standard: " + ", ".join(f"{k} {v / t['standard']:.3f}" for k, v in t.items() if k != "standard"))
