"""Every residual rule compiles without a graph break in its site: the transformer block (both sites and
both sublayers, as the trainer compiles it) is traced by dynamo with fullgraph=True, forward and backward,
also on a diagnostic step (the gated sites then record their gate statistics). Graph breaks are found by
dynamo's tracing whatever the backend, so the "eager" backend keeps this fast (no AOT autograd, no code
generation; tests/e2e/test_train_single.py trains with inductor end to end). Runtime: about 1 s per rule."""

from __future__ import annotations

import pytest
import torch

from rrtrain import residuals
from rrtrain.config import ModelConfig, ResidualConfig
from rrtrain.model.transformer import build_model


def tiny(variant: str) -> torch.nn.Module:
    torch.manual_seed(0)
    m = ModelConfig(size="tiny", variant=variant, d_model=32, n_layers=1, n_heads=4, d_ff=64, seq_len=8,
                    vocab_size=64, residual=ResidualConfig())
    return build_model(m)


def as_tuple(state):
    return tuple(state) if isinstance(state, (tuple, list)) else (state,)


@pytest.mark.parametrize("name", residuals.names())
def test_rule_compiles_in_its_block_without_graph_breaks(name):
    torch._dynamo.reset()
    model = tiny(name)
    block = model.blocks[0]
    compiled = torch.compile(block, fullgraph=True, backend="eager")
    idx = torch.randint(0, 64, (2, 8))
    for record in (False, True):
        for site in model.sites():
            site.record = record
        state = model.stream.expand(model.tok_emb(idx))
        want = as_tuple(block(state))
        got = as_tuple(compiled(state))
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        sum(g.float().sum() for g in got).backward()
        if record and residuals.get(name).gated:
            assert all(s.stats for s in model.sites())
