"""Single-stream residual rules: the hand-worked vectors of docs/residuals.md ("Test vectors"), gates at initialisation,
the low-rank gate, and the interface contract every registered rule must keep.

The vectors are reproduced by building one site (d = 2), injecting the sublayer output u and the gate
value directly, and calling `write`; nothing here re-implements a rule.
"""

from __future__ import annotations

import math

import pytest
import torch

from rrtrain import residuals
from rrtrain.config import ModelConfig
from rrtrain.resolve import build_model
from rrtrain.residuals import SiteInfo, StreamInfo
from rrtrain.residuals.gates import Gate

H = torch.tensor([[[2.0, 2.0]]], dtype=torch.float64)  # (B=1, T=1, d=2)
U = torch.tensor([[[4.0, -4.0]]], dtype=torch.float64)


def make_site(name: str, d: int = 2, index: int = 0, n_sublayers: int = 2, **cfg) -> torch.nn.Module:
    info = SiteInfo(d, index, n_sublayers, "attn", 1e-6, residuals.get(name).make_knobs(**cfg))
    return residuals.get(name).site(info).double()


def tiny_model(variant: str, **residual) -> torch.nn.Module:
    m = ModelConfig(size="tiny", variant=variant, d_model=32, n_layers=2, n_heads=4, d_ff=64, seq_len=16,
                    vocab_size=64, residual=dict(**residual))
    return build_model(m)


def set_gate_value(site: torch.nn.Module, r: float) -> None:
    """Make the site's gate output exactly r everywhere: W = 0, b = logit(r)."""
    gate = site.gate
    with torch.no_grad():
        for p in gate.parameters():
            p.zero_()
        gate.bias.fill_(math.log(r / (1.0 - r)))


# ---------------------------------------------------------------------------------------------
# Review, W_r = 0  =>  r = 0.5


def test_review_vector_additive():
    out = make_site("review").write(H, U, None)
    torch.testing.assert_close(out, torch.tensor([[[4.0, 0.0]]], dtype=torch.float64), rtol=0, atol=1e-12)


def test_review_vector_convex():
    out = make_site("review_convex").write(H, U, None)
    torch.testing.assert_close(out, torch.tensor([[[3.0, -1.0]]], dtype=torch.float64), rtol=0, atol=1e-12)


def test_highway_additive_vector_at_init():
    # same gate value (0.5) but read from the state only: h + 0.5 u
    out = make_site("highway").write(H, U, None)
    torch.testing.assert_close(out, torch.tensor([[[4.0, 0.0]]], dtype=torch.float64), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# ReZero, LayerScale, Highway


def test_rezero_vectors():
    site = make_site("rezero")
    h = torch.tensor([[[1.0, 2.0]]], dtype=torch.float64)
    torch.testing.assert_close(site.write(h, U, None), h, rtol=0, atol=0)  # alpha = 0 at start
    with torch.no_grad():
        site.alpha.fill_(0.5)
    torch.testing.assert_close(site.write(h, U, None), torch.tensor([[[3.0, 0.0]]], dtype=torch.float64),
                               rtol=0, atol=1e-12)


def test_layerscale_vector():
    site = make_site("layerscale")
    with torch.no_grad():
        site.scale.fill_(0.1)
    h = torch.tensor([[[1.0, 2.0]]], dtype=torch.float64)
    torch.testing.assert_close(site.write(h, U, None), torch.tensor([[[1.4, 1.6]]], dtype=torch.float64),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("n_blocks,expected", [(4, 0.1), (18, 0.1), (20, 1e-5), (24, 1e-5), (25, 1e-6), (48, 1e-6)])
def test_layerscale_depth_rule(n_blocks, expected):
    """CaiT's start value by depth in blocks (0.1 up to 18, 1e-5 up to 24, 1e-6 deeper); config wins."""
    site = make_site("layerscale", index=0, n_sublayers=2 * n_blocks)
    assert site.scale.tolist() == pytest.approx([expected, expected], rel=1e-6)
    site = make_site("layerscale", index=0, n_sublayers=2 * n_blocks, layerscale_init=0.25)
    assert site.scale.tolist() == [0.25, 0.25]


def test_highway_convex_vector_default_carry_bias():
    """T = sigma(-2) = 0.1192029 by default: 0.8807971 h + 0.1192029 u = [2.238406, 1.284782]."""
    out = make_site("highway_convex").write(H, U, None)
    torch.testing.assert_close(out, torch.tensor([[[2.238406, 1.284782]]], dtype=torch.float64), rtol=0, atol=1e-6)


def test_injected_gate_value_is_used():
    """A gate forced to r = 0.25 gives h + 0.25 u (additive) and 0.75 h + 0.25 u (convex)."""
    for name, expected in (("review", [3.0, 1.0]), ("highway", [3.0, 1.0]),
                           ("review_convex", [2.5, 0.5]), ("highway_convex", [2.5, 0.5])):
        site = make_site(name)
        set_gate_value(site, 0.25)
        torch.testing.assert_close(site.write(H, U, None), torch.tensor([[expected]], dtype=torch.float64),
                                   rtol=0, atol=1e-6, msg=name)


def test_review_gate_reads_the_update_and_highway_does_not():
    """Review's gate depends on u; Highway's only on h (the property the paper's Table 1 is about)."""
    u2 = torch.tensor([[[-1.0, 3.0]]], dtype=torch.float64)
    for name, reads_u in (("review", True), ("highway", False)):
        site = make_site(name)
        torch.manual_seed(0)
        with torch.no_grad():
            for p in site.gate.parameters():
                p.normal_()
        r1 = (site.write(H, U, None) - H) / U
        r2 = (site.write(H, u2, None) - H) / u2
        assert (not torch.allclose(r1, r2)) == reads_u, name


# ---------------------------------------------------------------------------------------------
# Gates at initialisation, in a whole model


@pytest.mark.parametrize("name,expected", [("review", 0.5), ("review_convex", 0.5), ("highway", 0.5),
                                           ("highway_convex", 1.0 / (1.0 + math.exp(2.0)))])
@pytest.mark.parametrize("rank", [0, 4])
def test_every_gate_at_init(name, expected, rank):
    """Every gate output, for every token and channel of every sublayer, is sigma(default bias) at start."""
    torch.manual_seed(0)
    model = tiny_model(name, gate_rank=rank)
    outputs = []
    hooks = [m.register_forward_hook(lambda mod, args, out: outputs.append(out[1]))  # (merged, r)
             for m in model.modules() if isinstance(m, Gate)]
    assert len(hooks) == 2 * model.shape.n_layers
    model(torch.randint(0, 64, (2, 16)))
    assert len(outputs) == len(hooks)
    for r in outputs:
        assert r.shape == (2, 16, 32)
        torch.testing.assert_close(r, torch.full_like(r, expected), rtol=0, atol=1e-7)


def test_gate_bias_config():
    torch.manual_seed(0)
    model = tiny_model("highway_convex", gate_bias=-3.0)
    for site in model.sites():
        assert torch.all(site.gate.bias == -3.0)
    model = tiny_model("review", gate_bias=1.0)
    for site in model.sites():
        assert torch.all(site.gate.bias == 1.0)


def test_gate_stats_recorded_only_when_asked():
    torch.manual_seed(0)
    model = tiny_model("review")
    idx = torch.randint(0, 64, (2, 16))
    model(idx)
    assert all(site.stats == {} for site in model.sites())
    for site in model.sites():
        site.record = True
    model(idx)
    for site in model.sites():
        assert float(site.stats["gate_mean"]) == pytest.approx(0.5, abs=1e-7)
        assert float(site.stats["gate_std"]) == pytest.approx(0.0, abs=1e-7)


def test_low_rank_gate_starts_at_half_and_both_factors_learn():
    """gate_rank = k: W = U V (2d -> k -> d), r = 0.5 at start, both factors get gradient.

    U = 0 at start (so r = 0.5), which makes V's first gradient U^T(...) exactly zero: after the first
    backward only U (`up`) has a nonzero gradient; after one optimizer step U is nonzero and V (`down`)
    gets gradient too. (With U = V = 0 neither would ever move.)
    """
    torch.manual_seed(0)
    model = tiny_model("review", gate_rank=4)
    site = model.sites()[0]
    assert site.gate.down.weight.shape == (4, 64) and site.gate.up.weight.shape == (32, 4)
    assert not hasattr(site.gate, "proj")
    idx, tgt = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    outputs = []
    site.gate.register_forward_hook(lambda mod, args, out: outputs.append(out[1]))  # (merged, r)
    model(idx, tgt).backward()
    torch.testing.assert_close(outputs[0], torch.full_like(outputs[0], 0.5), rtol=0, atol=0)
    for s in model.sites():
        assert s.gate.up.weight.grad.abs().max() > 0, "up factor got no gradient"
        assert s.gate.bias.grad.abs().max() > 0
    with torch.no_grad():  # one plain SGD step
        for p in model.parameters():
            p -= 0.1 * p.grad
            p.grad = None
    model(idx, tgt).backward()
    for s in model.sites():
        assert s.gate.up.weight.grad.abs().max() > 0
        assert s.gate.down.weight.grad.abs().max() > 0, "down factor got no gradient"


def test_full_rank_gate_gets_gradient_at_init():
    """W_r = 0 at start but dL/dW_r = (dL/dr * r(1-r)) z^T is not: the gate learns from the first step."""
    torch.manual_seed(0)
    model = tiny_model("review")
    model(torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))).backward()
    for s in model.sites():
        assert torch.all(s.gate.proj.weight == 0)
        assert s.gate.proj.weight.grad.abs().max() > 0


@pytest.mark.parametrize("rank,expected", [(0, 2 * 8 * 8 + 8), (3, 3 * 16 + 8 * 3 + 8)])
def test_gate_count(rank, expected):
    gate = Gate(16, 8, rank, 0.0)
    assert Gate.count(16, 8, rank) == expected == sum(p.numel() for p in gate.parameters())


# ---------------------------------------------------------------------------------------------
# Contract of every registered rule (picks up rules added later)


@pytest.mark.parametrize("name", residuals.names())
def test_rule_spec_contract(name):
    spec = residuals.get(name)
    assert spec.name == name and spec.summary
    d, n_sub = 16, 4
    cfg = spec.make_knobs()
    stream = spec.stream(StreamInfo(d, n_sub, 1e-6, cfg))
    sites = [spec.site(SiteInfo(d, i, n_sub, "attn" if i % 2 == 0 else "mlp", 1e-6, cfg)) for i in range(n_sub)]
    built = sum(p.numel() for p in stream.parameters()) + sum(p.numel() for s in sites for p in s.parameters())
    assert spec.params(d, n_sub, cfg) == built
    # no_decay names must name real parameters, or the optimizer would silently decay them
    for module in [stream, *sites]:
        own = {n for n, _ in module.named_parameters()}
        for pattern in module.no_decay:
            assert any(n == pattern or n.endswith("." + pattern) or n.startswith(pattern) for n in own), \
                f"{name}: no_decay entry '{pattern}' matches no parameter of {type(module).__name__}"


def test_unknown_rule_lists_known():
    with pytest.raises(KeyError, match="known: .*review"):
        residuals.get("reveiw")


def test_registering_twice_is_refused():
    with pytest.raises(ValueError, match="registered twice"):
        residuals.register(residuals.get("review"))


def test_paper_rules_registered():
    for name in ("standard", "review", "review_convex", "highway", "highway_convex", "rezero", "layerscale"):
        assert name in residuals.names()
    assert residuals.get("review").gated and not residuals.get("review").convex
    assert residuals.get("review_convex").convex and residuals.get("highway_convex").convex
    assert not residuals.get("standard").gated


@pytest.mark.parametrize("name", residuals.names())
def test_rule_runs_under_bf16_autocast(name):
    """One process with parallel.precision=bf16 runs the model under CPU autocast: fp32 weights and state, bf16
    sublayer outputs. Every rule takes that mix (the convex gates' torch.lerp once refused it) and returns
    finite fp32 gradients."""
    torch.manual_seed(0)
    model = tiny_model(name)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16)))
    loss.backward()
    assert math.isfinite(loss.item())
    for n, p in model.named_parameters():
        assert p.grad is not None and p.grad.dtype == p.dtype and bool(torch.isfinite(p.grad).all()), n
