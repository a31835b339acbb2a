"""Presets, analytic parameter counts against models built on the meta device, FLOPs, and matching.

Counting tests build on `device="meta"` (no memory is allocated, so rr-1b costs nothing) with
`Transformer.init_weights` switched off, and the initialisers that module constructors run themselves
(`nn.Linear`'s and `nn.Embedding`'s `reset_parameters`, RoPE's cos/sin tables, which are buffers): the count does
not depend on the values, and computing values on meta tensors (each op through torch's reference
decompositions) is the slow part of a meta build, four fifths of it with RoPE at rr-1b. `test_model.py` covers
init on meta separately.
"""

from __future__ import annotations

import dataclasses

import pytest
from torch import nn

from rrtrain import residuals

from rrtrain import sizing
from rrtrain.config import ModelConfig
from rrtrain.core.errors import UsageError
from rrtrain.model.transformer import Rotary, Transformer
from rrtrain.resolve import build_model

UP_TO_1B = ["tiny", "rr-60m", "rr-150m", "rr-320m", "rr-590m", "rr-1b"]
NOMINAL = {"rr-60m": 60e6, "rr-150m": 150e6, "rr-320m": 320e6, "rr-590m": 590e6, "rr-1b": 1e9,
           "frontier-7b": 7e9, "frontier-70b": 70e9}


@pytest.fixture
def no_init(monkeypatch):
    monkeypatch.setattr(Transformer, "init_weights", lambda self, seed: None)
    for module in (Rotary, nn.Linear, nn.Embedding):  # values only: the parameters are made before
        monkeypatch.setattr(module, "reset_parameters", lambda self, *args, **kwargs: None)


def meta_count(m: ModelConfig) -> int:
    model = build_model(m, device="meta")
    assert all(p.is_meta for p in model.parameters())
    return sum(p.numel() for p in model.parameters())


def analytic(m: ModelConfig) -> int:
    return sizing.count_params(sizing.resolve_shape(m), m.variant, m.residual)


# ---------------------------------------------------------------------------------------------
# Presets


def test_presets_listed_in_size_order():
    table = sizing.presets()
    names = [n for n in table if table[n].nominal_params is not None]  # the CPU presets (tiny, ...) come first
    assert list(table)[:len(table) - len(names)] == sorted(n for n in table if n not in names)
    assert "tiny" in table and names[:5] == UP_TO_1B[1:] and set(names[5:]) == {"frontier-7b", "frontier-70b"}


@pytest.mark.parametrize("size,blocks", [("rr-590m", 20), ("rr-1b", 24)])
def test_paper_depths(size, blocks):
    """590M is 20 blocks = 40 sublayers and 1B is 24 blocks = 48 sublayers, as in the paper."""
    s = sizing.resolve_shape(ModelConfig(size=size))
    assert s.n_layers == blocks and s.n_sublayers == 2 * blocks
    assert s.vocab_size == 50257 and s.d_ff == 4 * s.d_model and s.d_model % s.n_heads == 0


@pytest.mark.parametrize("size", [s for s in NOMINAL])
def test_review_within_12_percent_of_nominal(size):
    count = analytic(ModelConfig(size=size, variant="review"))
    assert abs(count / NOMINAL[size] - 1) <= 0.12, f"{size}: {count:,}"
    assert sizing.presets()[size].nominal_params == NOMINAL[size]


def test_resolve_shape_overrides():
    s = sizing.resolve_shape(ModelConfig(size="rr-60m", d_model=256, n_heads=4))
    assert (s.d_model, s.n_layers, s.n_heads, s.d_ff) == (256, 8, 4, 1024)  # d_ff follows a new d_model
    assert sizing.resolve_shape(ModelConfig(size="tiny")).d_ff == 256  # the preset's own d_ff
    assert sizing.resolve_shape(ModelConfig(size="tiny", d_ff=100)).d_ff == 100
    assert sizing.resolve_shape(ModelConfig(size="tiny"), vocab_size=257).vocab_size == 257  # dataset's
    assert sizing.resolve_shape(ModelConfig(size="tiny", vocab_size=300), vocab_size=257).vocab_size == 300


@pytest.mark.parametrize("overrides,message", [
    (dict(size="rr-600m"), "model.size: unknown preset 'rr-600m' (did you mean 'rr-60m'?)"),
    (dict(d_model=100, n_heads=3), "model.d_model=100 is not divisible by model.n_heads=3"),
    (dict(n_layers=0), "model.n_layers must be at least 1, got 0"),
    (dict(d_model=96, n_heads=32, pos="rope"), "model.pos=rope needs an even head size, got d_model/n_heads=3"),
])
def test_resolve_shape_errors(overrides, message):
    with pytest.raises(UsageError) as err:
        sizing.resolve_shape(ModelConfig(**overrides))
    assert str(err.value).startswith(message)


# ---------------------------------------------------------------------------------------------
# Analytic counts == meta-built counts


@pytest.mark.parametrize("size", UP_TO_1B)
def test_analytic_count_equals_meta_model_every_variant(size, no_init):
    for name in residuals.names():
        m = ModelConfig(size=size, variant=name)
        assert analytic(m) == meta_count(m), f"{size} {name}"


@pytest.mark.parametrize("size", ["tiny", "rr-1b"])
@pytest.mark.parametrize("pos,rank", [("rope", 0), ("learned", 8), ("rope", 64)])
def test_analytic_count_low_rank_and_rope_every_variant(size, pos, rank, no_init):
    """gate_rank > 0 and RoPE (no position table) at the shallowest and the deepest preset."""
    for name in residuals.names():
        m = ModelConfig(size=size, variant=name, pos=pos, residual=dict(gate_rank=rank))
        assert analytic(m) == meta_count(m), f"{size} {name} pos={pos} gate_rank={rank}"


def test_gate_rank_changes_gated_counts_only():
    s = sizing.resolve_shape(ModelConfig(size="rr-150m"))
    d, n_sub = s.d_model, s.n_sublayers
    full, low = dict(), dict(gate_rank=128)
    # review: 3 norms + (2d x d) + bias per sublayer; low rank: 2d*k + k*d instead of 2d*d
    assert sizing.gate_params(s, "review", full) == n_sub * (2 * d + 2 * d * d + d)
    assert sizing.gate_params(s, "review", low) == n_sub * (2 * d + 3 * d * 128 + d)
    assert sizing.gate_params(s, "highway", full) == n_sub * (d + d * d + d)
    assert sizing.gate_params(s, "standard", low) == 0
    assert sizing.gate_params(s, "rezero", full) == n_sub
    assert sizing.gate_params(s, "layerscale", full) == n_sub * d


def test_backbone_formula():
    s = sizing.ModelShape(d_model=64, n_layers=3, n_heads=4, d_ff=200, seq_len=32, vocab_size=100)
    assert sizing.backbone_params(s) == 100 * 64 + 32 * 64 + 3 * (4 * 64 * 64 + 2 * 64 * 200)
    assert sizing.backbone_params(dataclasses.replace(s, pos="rope")) == sizing.backbone_params(s) - 32 * 64
    assert sizing.count_params(s, "standard", dict()) == sizing.backbone_params(s) + 64 * 7


def test_flops_per_token_formula():
    """6 * (matmul params incl. the tied head, no position table) + 12 * n_layers * seq_len * d_model: PaLM's
    6N + 12LHQT, with N the weights a token passes through."""
    s = sizing.resolve_shape(ModelConfig(size="rr-150m"))
    cfg = dict()
    n = sizing.count_params(s, "standard", cfg) - s.seq_len * s.d_model
    assert sizing.flops_per_token(s, "standard", cfg) == 6 * n + 12 * s.n_layers * s.seq_len * s.d_model
    extra = sizing.flops_per_token(s, "review", cfg) - sizing.flops_per_token(s, "standard", cfg)
    assert extra == 6 * sizing.gate_params(s, "review", cfg)
    # GPT-2 small's shape (12 x 768, T=1024, 50,304 vocabulary): nanoGPT's estimate_mfu counts 6N + 12LHQT with
    # N its parameters less the position table (the tied head counted once), within 0.2% of this
    gpt2 = 12 * (12 * 768 * 768 + 13 * 768) + 2 * 768 + 50304 * 768  # blocks (weights, biases, LNs), ln_f, wte
    assert sizing.flops_per_token(s, "standard", cfg) == pytest.approx(6 * gpt2 + 12 * 12 * 768 * 1024, rel=2e-3)


# ---------------------------------------------------------------------------------------------
# Parameter matching


@pytest.mark.parametrize("widen", ["mlp", "model"])
@pytest.mark.parametrize("size", UP_TO_1B)
def test_matching_within_half_percent_every_variant(size, widen):
    m = ModelConfig(size=size)
    sized = sizing.size_variants(m, residuals.names(), "review", widen, 0.005)
    target = sized["review"].params
    assert sized["review"].shape == sizing.resolve_shape(m)  # the reference is not touched
    for name, s in sized.items():
        assert abs(s.params - target) <= 0.005 * target, f"{size} {name} widen={widen}: {s.params:,} vs {target:,}"
        assert s.params == sizing.count_params(s.shape, name, m.residual)
        assert s.shape.n_layers == sized["review"].shape.n_layers  # widening never changes depth
        assert s.shape.d_model % s.shape.n_heads == 0
        if widen == "mlp":
            assert s.shape.d_model == sized["review"].shape.d_model
        else:
            assert s.shape.head_dim == sized["review"].shape.head_dim


def test_matching_widens_the_smaller_and_narrows_the_larger():
    m = ModelConfig(size="rr-320m")
    base = sizing.resolve_shape(m)
    wider = sizing.size_variants(m, ["review", "standard", "highway"], "review")
    assert wider["standard"].shape.d_ff > wider["highway"].shape.d_ff > base.d_ff
    narrower = sizing.size_variants(m, ["standard", "review"], "standard")
    assert narrower["review"].shape.d_ff < base.d_ff
    assert abs(narrower["review"].params - narrower["standard"].params) <= 0.005 * narrower["standard"].params
    model = sizing.size_variants(m, ["review", "standard"], "review", widen="model")
    assert model["standard"].shape.d_model > base.d_model


def test_matched_shape_builds_with_the_matched_count(no_init):
    m = ModelConfig(size="rr-590m")
    for widen in ("mlp", "model"):
        sized = sizing.size_variants(m, ["review", "standard"], "review", widen)
        s = sized["standard"]
        model = build_model(dataclasses.replace(m, variant="standard"), device="meta", shape=s.shape)
        assert sum(p.numel() for p in model.parameters()) == s.params


def test_matching_impossible_is_a_usage_error():
    m = ModelConfig(size="tiny")
    with pytest.raises(UsageError, match="cannot match rezero to within 0.00%"):
        sizing.size_variants(m, ["review", "rezero"], "review", tolerance=0.0)
    with pytest.raises(UsageError, match="larger even with d_ff=1"):
        sizing.match_shape(sizing.resolve_shape(m), "review", m.residual, target=1000)


def test_without_reference_nothing_is_widened():
    m = ModelConfig(size="rr-150m")
    sized = sizing.size_variants(m, ["standard", "review"])
    assert sized["standard"].shape == sized["review"].shape == sizing.resolve_shape(m)
    assert sized["review"].params - sized["standard"].params == sized["review"].gate_params
