"""Learning-rate schedule and weight-decay groups."""

from __future__ import annotations

import math

import pytest

from rrtrain.config import ModelConfig
from rrtrain.resolve import build_model
from rrtrain.parallel.adamw import no_decay_names, param_groups
from rrtrain.training.optim import lr_at


def test_warmup_then_cosine_to_floor():
    lrs = [lr_at(s, 100, 1.0, 10, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:10]))  # rising during warmup
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # then never rising
    assert lr_at(100, 100, 1.0, 10, 0.1) == pytest.approx(0.1)  # the floor at the end
    mid = 10 + 45
    assert lr_at(mid, 100, 1.0, 10, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))


@pytest.mark.parametrize("variant", ["review", "rezero", "layerscale", "highway_convex"])
def test_weight_decay_on_matrices_only(variant):
    model = build_model(ModelConfig(size="tiny", variant=variant, vocab_size=64, residual=dict(gate_rank=4)),
                        device="meta")
    skip = no_decay_names(model)
    named = dict(model.named_parameters())
    for name, p in named.items():
        if p.ndim < 2:
            assert name in skip, name  # norms, biases, scalars, per-channel scales
    assert "blocks.0.attn.qkv.weight" not in skip and "tok_emb.weight" not in skip
    if variant in ("review", "highway_convex"):
        assert "blocks.0.attn_site.gate.bias" in skip and "blocks.0.attn_site.gate.up.weight" not in skip
    if variant == "rezero":
        assert "blocks.1.mlp_site.alpha" in skip
    groups = param_groups(model, 0.1)
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert sum(len(g["params"]) for g in groups) == len(named)  # every parameter in exactly one group
