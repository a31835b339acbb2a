"""Multi-stream (gr, hc, mhc), depth-aggregating (attnres) and post-norm (deepnorm) residual rules.

The hand-worked vectors of docs/residuals.md ("Test vectors") in float64 to 1e-6; Sinkhorn's properties;
the equivalences at initialisation; GR's symmetry breaking; HC's mixing-direction convention; forward+backward in fp32 and bf16; parameter formulas against meta-built models.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch

from rrtrain import residuals, sizing

from rrtrain.config import ModelConfig
from rrtrain.resolve import build_model
from rrtrain.residuals import SiteInfo, StreamInfo
from rrtrain.residuals.attnres import AttnResSite, AttnResStream, depth_attention
from rrtrain.residuals.deepnorm import DeepNormSite, deepnorm_alpha, deepnorm_beta
from rrtrain.residuals.gr import GRSite, GRStream, branch_norm, gr_read
from rrtrain.residuals.hc import HCSite
from rrtrain.residuals.mhc import MHCSite, sinkhorn
from rrtrain.residuals.streams import mix, tile

F64 = torch.float64
NEW = ("gr", "hc", "mhc", "attnres", "deepnorm")


def t(*rows) -> torch.Tensor:
    """A float64 tensor with leading (b, t) = (1, 1) axes."""
    return torch.tensor(rows, dtype=F64)[None, None]


def site(cls, d: int = 2, n: int = 2, index: int = 0, n_sub: int = 4, eps: float = 0.0, **cfg):
    spec = sys.modules[cls.__module__].SPEC  # the rule of `cls`: its knobs
    knobs = spec.make_knobs(**({"streams": n} if "streams" in spec.knob_names() else {}), **cfg)
    info = SiteInfo(d, index, n_sub, "attn", eps, knobs)
    return cls(info).to(F64)


def tiny(variant: str, **res) -> ModelConfig:
    return ModelConfig(size="tiny", variant=variant, d_model=32, n_layers=2, n_heads=2, seq_len=16,
                       vocab_size=64, residual=dict(**res))


def close(a: torch.Tensor, b, tol: float = 1e-6) -> None:
    b = torch.as_tensor(b, dtype=a.dtype)
    err = (a - b).abs().max().item()
    assert err <= tol, f"max |a - b| = {err:.3g} > {tol:g}\n{a}\n{b}"


# ---------------------------------------------------------------------------------------------
# GR

R_SEED = t([2.0, 2.0], [4.0, -4.0])  # (1, 1, n=2, d=2)
Y_SEED = torch.tensor([[[0.5, -0.25]]], dtype=F64)


def test_gr_seed_worked_example_with_injected_controller_outputs():
    r_hat = branch_norm(R_SEED, torch.zeros(2, 2, dtype=F64), eps=0.0)
    close(r_hat, t([1.0, 1.0], [1.0, -1.0]))
    g = t([0.8, 0.2], [0.4, 0.6])
    close(gr_read(r_hat, g), [0.6, -0.2])  # divided by the branch count, not the gate sum
    s = torch.tensor([[[1.2, 0.4]]], dtype=F64)
    close(site(GRSite).write(R_SEED, Y_SEED, s), t([2.6, 1.7], [4.2, -4.1]))


def test_gr_zero_controllers_give_half_gates_and_unit_writes():
    gr = site(GRSite, gr_rank=1)
    for lin in (gr.ctrl.down, gr.ctrl.up, gr.ctrl.inj):
        torch.nn.init.zeros_(lin.weight)
    x, s = gr.read(R_SEED)
    close(x, [0.5, 0.0])
    close(s, [1.0, 1.0])
    close(gr.write(R_SEED, Y_SEED, s), t([2.5, 1.75], [4.5, -4.25]))


def test_gr_full_controller_path():  # n = 2, d = 2, r = 1
    gr = site(GRSite, gr_rank=1)
    with torch.no_grad():
        gr.ctrl.down.weight.copy_(torch.tensor([[1.0, 0, 0, 0]]))
        gr.ctrl.up.weight.copy_(torch.tensor([[2.0], [0], [0], [-2.0]]))
        gr.ctrl.inj.weight.copy_(torch.tensor([[0.5, 0.5, 0, 0], [0, 0, -1.0, 1.0]]))
    x, s, g = gr.ctrl(R_SEED)
    close(g, t([0.6507777, 0.5], [0.5, 0.3492223]), 1e-7)
    close(x, [0.5753888, 0.0753888], 1e-7)
    close(s, [1.2449187, 0.5378828], 1e-7)
    close(gr.write(R_SEED, Y_SEED, s), t([2.6224593, 1.6887703], [4.2689414, -4.1344707]), 1e-7)


def test_gr_readout_is_a_final_read_without_write_or_norm():
    info = StreamInfo(4, 8, 0.0, residuals.get("gr").make_knobs(streams=2, gr_rank=3))
    stream = GRStream(info).to(F64)
    assert stream.mixer.inj is None and not any("norm.weight" == n for n, _ in stream.named_parameters())
    r = torch.randn(2, 3, 2, 4, dtype=F64)
    r_hat = branch_norm(r, stream.mixer.norm_weight, 0.0)
    u = torch.nn.functional.silu(stream.mixer.down(r_hat.flatten(-2)) / 2)
    g = torch.sigmoid(stream.mixer.up(u)).unflatten(-1, (2, 4))
    close(stream.readout(r), (g * r_hat).mean(-2), 1e-12)


def _final_state(model, idx):
    out = {}
    handle = model.blocks[-1].register_forward_hook(lambda m, i, o: out.setdefault("s", o))
    model(idx)
    handle.remove()
    return out["s"]  # (B, T, n, D)


def _branch_spread(state: torch.Tensor) -> float:
    return (state - state.mean(-2, keepdim=True)).abs().max().item()


@pytest.mark.parametrize("zero_controllers", [False, True])
def test_gr_branches_diverge_after_one_step_unless_controllers_start_at_zero(zero_controllers):
    torch.manual_seed(0)
    model = build_model(tiny("gr"))
    if zero_controllers:  # the hazard: symmetric controllers keep tiled branches identical forever
        with torch.no_grad():
            for name, p in model.named_parameters():
                if any(k in name for k in ("down.", "up.", "inj.")):
                    p.zero_()
    idx = torch.randint(0, 64, (2, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(idx, idx.roll(-1, 1)).backward()
    opt.step()
    with torch.no_grad():
        spread = _branch_spread(_final_state(model, idx))
    if zero_controllers:
        assert spread < 1e-6
    else:
        assert spread > 1e-3


# ---------------------------------------------------------------------------------------------
# HC

S_HC = t([1.0, 2.0], [3.0, 4.0])


def test_hc_static_arbitrary_coefficients():
    hc = site(HCSite, hc_dynamic=False)
    with torch.no_grad():
        hc.static_a.copy_(torch.tensor([0.7, 0.3]))
        hc.static_A.copy_(torch.tensor([[0.9, 0.1], [0.2, 0.8]]))  # rows = source
        hc.static_b.copy_(torch.tensor([1.0, 0.5]))
    x, ctx = hc.mix_in(S_HC)
    close(x, [1.6, 2.6])
    close(hc.write(S_HC, torch.tensor([[[0.5, -1.0]]], dtype=F64), ctx), t([2.0, 1.6], [2.75, 2.9]))


@pytest.mark.parametrize("dynamic", [False, True])
def test_hc_init_reads_stream_k_mod_n_and_adds_y_everywhere(dynamic):
    y = torch.tensor([[[0.5, -1.0]]], dtype=F64)
    for k, expected in ((0, [1.0, 2.0]), (1, [3.0, 4.0]), (2, [1.0, 2.0])):
        hc = site(HCSite, index=k, hc_dynamic=dynamic, eps=1e-6)
        x, ctx = hc.mix_in(S_HC)  # dynamic projections start at 0: exactly the static coefficients
        close(x, expected)
        close(hc.write(S_HC, y, ctx), t([1.5, 1.0], [3.5, 3.0]))


def test_hc_dynamic_coefficients():
    hc = site(HCSite, hc_dynamic=True)
    with torch.no_grad():
        hc.dyn_proj.zero_()
        hc.dyn_proj[:, 0] = torch.tensor([1.0, 0.0])  # w_a
        hc.dyn_proj[:, 3] = torch.tensor([0.5, 0.5])  # w_b (W_A = 0)
    s = t([2.0, 2.0], [4.0, -4.0])
    a, A, b = hc.coefficients(s)
    close(b, [1.0076159, 1.0], 1e-7)
    close(a, [1.0076159, 0.0076159], 1e-7)
    x, ctx = hc.mix_in(s)
    close(x, [2.0456957, 1.9847681], 1e-7)
    out = hc.write(s, torch.tensor([[[0.5, -0.25]]], dtype=F64), ctx)
    close(out, t([2.5038080, 1.7480960], [4.5, -4.25]), 1e-7)


def test_hc_mixing_matrix_is_applied_with_rows_as_sources():
    """lucidrains/hyper-connections#8: a computed-but-unused mix. A ≠ I must change the output, as documented."""
    hc = site(HCSite, hc_dynamic=False)
    y = torch.zeros(1, 1, 2, dtype=F64)
    _, ctx = hc.mix_in(S_HC)
    unmixed = hc.write(S_HC, y, ctx)
    with torch.no_grad():
        hc.static_A.copy_(torch.tensor([[1.0, 1.0], [0.0, 1.0]]))  # source 1 feeds both destinations
    _, ctx = hc.mix_in(S_HC)
    mixed = hc.write(S_HC, y, ctx)
    assert not torch.allclose(mixed, unmixed)
    close(mixed, t([1.0, 2.0], [4.0, 6.0]))  # S'_1 = S_1, S'_2 = S_1 + S_2


def test_mix_matmul_and_low_precision_paths_agree():
    s = torch.randn(2, 3, 4, 8)
    m = torch.randn(2, 3, 4, 4)
    wide = mix(m, s)
    narrow = mix(m, s.to(torch.bfloat16))  # fp32 coefficients times a bf16 state
    assert narrow.dtype == torch.float32
    close(narrow, wide, 0.1)
    close(mix(m, s), torch.einsum("btij,btid->btjd", m, s), 1e-5)


# ---------------------------------------------------------------------------------------------
# mHC

def test_sinkhorn_hand_vectors():  # column step, then row step, per iteration
    lg = torch.tensor([[0.0, -1.0], [-2.0, 0.0]], dtype=F64)
    close(sinkhorn(lg, 1, 0.0), torch.tensor([[0.766085, 0.233915], [0.140196, 0.859804]], dtype=F64))
    close(sinkhorn(lg, 2, 0.0), torch.tensor([[0.798078, 0.201922], [0.164424, 0.835576]], dtype=F64))
    close(sinkhorn(lg, 20, 0.0), torch.tensor([[0.817574, 0.182426], [0.182426, 0.817574]], dtype=F64))
    close(sinkhorn(lg, 200, 0.0).diagonal(), 1.0 / (1.0 + math.exp(-1.5)), 1e-7)  # σ(1.5) = 0.8175745


def test_sinkhorn_random_logits_fp32():
    g = torch.Generator().manual_seed(0)
    cfg = residuals.get("mhc").make_knobs()
    lg = torch.randn(64, 4, 4, generator=g)
    m = sinkhorn(lg, cfg.sinkhorn_iters, cfg.sinkhorn_eps)
    assert m.dtype == torch.float32
    close(m.sum(-1), 1.0, 1e-6)
    close(m.sum(-2), 1.0, 1e-3)
    two = torch.randn(64, 2, 2, generator=g, dtype=F64)
    limit = torch.sigmoid((two[:, 0, 0] + two[:, 1, 1] - two[:, 0, 1] - two[:, 1, 0]) / 2)
    close(sinkhorn(two, 500, 0.0)[:, 0, 0], limit, 1e-9)


def test_sinkhorn_survives_bf16_logits_and_saturation():
    lg = torch.tensor([[0.0, -200.0], [-200.0, 0.0]], dtype=torch.bfloat16)
    m = sinkhorn(lg, 20, 1e-6)
    assert m.dtype == torch.float32 and torch.isfinite(m).all()


def test_mhc_layer_vector():  # H_res rows = destination
    mhc = site(MHCSite)
    s = t([2.0, 2.0], [4.0, -4.0])
    h_pre = torch.tensor([[[0.5, 0.5]]], dtype=F64)
    close((h_pre.unsqueeze(-1) * s).sum(-2), [3.0, -1.0])
    h_res = torch.tensor([[[[0.8, 0.2], [0.2, 0.8]]]], dtype=F64)
    out = mhc.write(s, torch.tensor([[[0.5, -0.25]]], dtype=F64), (torch.ones(1, 1, 2, dtype=F64), h_res))
    close(out, t([2.9, 0.55], [4.1, -3.05]))
    h_res = torch.tensor([[[[1.0, 0.0], [1.0, 0.0]]]], dtype=F64)  # destination 2 takes source 1
    out = mhc.write(s, torch.zeros(1, 1, 2, dtype=F64), (torch.zeros(1, 1, 2, dtype=F64), h_res))
    close(out, t([2.0, 2.0], [2.0, 2.0]))


def test_mhc_near_identity_init_that_learns():
    mhc = site(MHCSite, d=8, n=4, eps=1e-6)
    s = torch.randn(2, 3, 4, 8, dtype=F64)
    h_pre, h_post, h_res = mhc.coefficients(s)
    close(h_pre, 0.25, 1e-3)
    close(h_post, 1.0, 1e-3)
    assert h_res.diagonal(dim1=-2, dim2=-1).min() > 0.97  # -5 off-diagonal logits: ≈0.98, not saturated
    x, ctx = mhc.read(s)
    (x.square().sum() + mhc.write(s, x, ctx).square().sum()).backward()
    for name in ("phi", "alpha", "bias"):
        assert getattr(mhc, name).grad.abs().max() > 0, name
    assert mhc.bias.grad[2 * 4:].abs().max() > 1e-8  # the H_res logits are not stuck in a saturated softmax


# ---------------------------------------------------------------------------------------------
# AttnRes

def test_attnres_hand_vector():
    v0, v1 = torch.tensor([[[2.0, 2.0]]], dtype=F64), torch.tensor([[[4.0, -4.0]]], dtype=F64)
    ones = torch.ones(2, dtype=F64)
    close(depth_attention((v0, v1), torch.zeros(2, dtype=F64), ones, 0.0), [3.0, -1.0])
    w = torch.tensor([0.0, 0.5 * math.log(3.0)], dtype=F64)
    close(depth_attention((v0, v1), w, ones, 0.0), [2.5, 0.5])


def test_attnres_zero_queries_read_the_mean_of_sources():
    ar = site(AttnResSite, d=8, index=3, eps=1e-6)
    sources = tuple(torch.randn(2, 3, 8, dtype=F64) * (j + 1) for j in range(4))
    close(ar.agg(sources), torch.stack(sources).mean(0), 1e-12)


@pytest.mark.parametrize("size, lengths", [(0, [2, 3, 4, 5]), (2, [2, 2, 3, 3]), (3, [2, 2, 2, 3])])
def test_attnres_block_bookkeeping(size, lengths):
    """Full: one source per sublayer; Block: a block opens at every multiple of the block size. The state keeps
    its S slots throughout (the sources are the last ones, the bias masks the others)."""
    stream = AttnResStream(StreamInfo(2, 4, 0.0, residuals.get("attnres").make_knobs(attnres_block_size=size)))
    state = stream.expand(torch.zeros(1, 1, 2))
    ys = [torch.full((1, 1, 2), float(10 ** i)) for i in range(4)]
    for index, (y, n) in enumerate(zip(ys, lengths)):
        state = site(AttnResSite, index=index, attnres_block_size=size).to(torch.float32).write(state, y, None)
        assert len(state.slots) == lengths[-1] and int((state.bias == 0).sum()) == n
        assert torch.isneginf(state.bias[:-n]).all()
    sources = state.slots[len(state.slots) - lengths[-1]:]
    if size == 2:
        close(sources[1], 11.0)
        close(sources[2], 1100.0)


# ---------------------------------------------------------------------------------------------
# DeepNorm

@pytest.mark.parametrize("n, alpha, beta", [(8, 2.0, 0.35355), (12, 2.21336, 0.31947), (16, 2.37841, 0.29730),
                                            (24, 2.63215, 0.26864), (32, 2.82843, 0.25), (48, 3.13017, 0.22590)])
def test_deepnorm_constants(n, alpha, beta):
    assert abs(deepnorm_alpha(n) - alpha) < 5e-6 and abs(deepnorm_beta(n) - beta) < 5e-6  # table's rounding
    assert abs(deepnorm_alpha(n) ** 4 - 2 * n) < 1e-9 and abs(deepnorm_beta(n) ** -4 - 8 * n) < 1e-9
    assert residuals.get("deepnorm").branch_init_gain(n) == deepnorm_beta(n)


def test_deepnorm_post_norm_update():
    dn = site(DeepNormSite, n_sub=16)  # N = 8 blocks: α = 2
    h = torch.tensor([[[1.0, 2.0]]], dtype=F64)
    x, ctx = dn.read(h)
    assert x is h  # no pre-norm inside the branch
    close(dn.write(h, torch.tensor([[[4.0, -4.0]]], dtype=F64), ctx), [math.sqrt(2.0), 0.0])  # RMSN([6, 0])


def test_deepnorm_scales_branch_init():
    torch.manual_seed(0)
    cfg = tiny("deepnorm")
    cfg.d_model = 128
    model = build_model(cfg)
    beta = deepnorm_beta(2)
    block = model.blocks[0]
    assert abs(block.mlp.fc.weight.std().item() / (0.02 * beta) - 1) < 0.05
    assert abs(block.attn.qkv.weight[:128].std().item() / 0.02 - 1) < 0.05  # q rows keep gain 1


# ---------------------------------------------------------------------------------------------
# Equivalences at initialisation, whole tiny models, float64

def _copy_backbone(src, dst) -> None:
    keep = {k: v for k, v in src.state_dict().items() if "_site." not in k and not k.startswith("stream.")}
    missing = set(keep) - set(dst.state_dict())
    assert not missing
    dst.load_state_dict(keep, strict=False)


def _pair(variant: str, **res):
    """A standard model and `variant` with identical backbones, float64, negligible norm eps."""
    def build(v, **kw):
        m = tiny(v, **kw)
        m.norm_eps = 1e-30
        return build_model(m).to(F64)

    torch.manual_seed(0)
    ref, other = build("standard"), build(variant, **res)
    _copy_backbone(ref, other)
    return ref, other


@pytest.mark.parametrize("dynamic", [False, True])
def test_hc_at_init_equals_prenorm_residual(dynamic):
    ref, hc = _pair("hc", hc_dynamic=dynamic)
    idx = torch.randint(0, 64, (2, 16))
    close(hc(idx), ref(idx), 1e-6)  # the model's RMSNorm computes in fp32 even in a float64 model


def test_mhc_with_one_stream_equals_prenorm_residual():
    ref, mhc = _pair("mhc", streams=1)
    with torch.no_grad():
        for name, p in mhc.named_parameters():
            if name.endswith(".phi") or name.endswith("head_fn"):
                p.zero_()
    idx = torch.randint(0, 64, (2, 16))
    close(mhc(idx), ref(idx), 1e-6)


def test_identity_path_when_sublayers_output_zero():
    """y = 0 leaves the state unchanged (HC at init, GR; mHC up to Sinkhorn error on tiled streams)."""
    s = tile(torch.randn(2, 3, 8, dtype=F64), 4)
    y = torch.zeros(2, 3, 8, dtype=F64)
    for cls, tol in ((HCSite, 0.0), (GRSite, 0.0), (MHCSite, 1e-6)):
        rule = site(cls, d=8, n=4, eps=1e-6)
        close(rule.write(s, y, rule.read(s)[1]), s, tol)


# ---------------------------------------------------------------------------------------------
# Every new variant: fp32 and bf16 forward+backward, meta build, parameter formulas

VARIANTS = [("gr", {}), ("hc", {}), ("hc", {"hc_dynamic": False}), ("mhc", {}), ("attnres", {}),
            ("attnres", {"attnres_block_size": 3}), ("deepnorm", {})]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant, res", VARIANTS)
def test_forward_backward(variant, res, dtype):
    torch.manual_seed(0)
    model = build_model(tiny(variant, **res))
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        ref = model(idx, idx.roll(-1, 1)).item()
    model.to(dtype)
    loss = model(idx, idx.roll(-1, 1))
    assert loss.dtype == torch.float32 and torch.isfinite(loss) and abs(loss.item() - math.log(64)) < 1.0
    assert abs(loss.item() - ref) < 5e-3  # bf16 stays close to fp32 (seen: < 2e-4)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.dtype == dtype, name
        assert torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("variant, res", VARIANTS)
def test_activation_checkpointing_gives_the_same_gradients(variant, res):
    """Blocks recomputed in backward (non-reentrant checkpoint, tuple states included) change nothing."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = build_model(tiny(variant, **res))
    idx = torch.randint(0, 64, (2, 16))

    def grads(ac: bool) -> dict[str, torch.Tensor]:
        model.zero_grad()
        e = model.tok_emb(idx) + model.pos_emb(torch.arange(16))
        state = model.stream.expand(e)
        for block in model.blocks:
            state = checkpoint(block, state, use_reentrant=False) if ac else block(state)
        logits = torch.nn.functional.linear(model.stream.readout(state), model.tok_emb.weight)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.roll(-1, 1).flatten()).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain, recomputed = grads(False), grads(True)
    for name in plain:
        assert torch.allclose(plain[name], recomputed[name], atol=1e-6, rtol=1e-5), name


@pytest.mark.parametrize("variant", ["gr", "mhc"])
def test_gated_rules_record_gate_statistics(variant):
    model = build_model(tiny(variant))
    assert residuals.get(variant).gated
    for s in model.sites():
        s.record = True
    model(torch.randint(0, 64, (2, 16)))
    stats = model.sites()[0].stats
    assert set(stats) == {"gate_mean", "gate_std", "gate_hist"} and 0.0 < stats["gate_mean"].item() < 1.0
    assert stats["gate_hist"].shape == (residuals.base.GATE_BINS,) and stats["gate_hist"].sum() > 0


@pytest.mark.parametrize("variant, res", VARIANTS)
def test_meta_build_then_init_matches_a_direct_build(variant, res):
    cfg = tiny(variant, **res)
    direct = build_model(cfg, seed=3)
    meta = build_model(cfg, device="meta")
    meta.to_empty(device="cpu")
    meta.init_weights(3)
    a, b = direct.state_dict(), meta.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("variant, res", [
    ("gr", {}), ("gr", {"streams": 2, "gr_rank": 3}), ("gr", {"streams": 1}),
    ("hc", {}), ("hc", {"streams": 3}), ("hc", {"hc_dynamic": False, "streams": 2}),
    ("mhc", {}), ("mhc", {"streams": 1}), ("mhc", {"streams": 3}),
    ("attnres", {}), ("attnres", {"attnres_block_size": 4}), ("deepnorm", {}),
])
@pytest.mark.parametrize("d, layers, heads", [(16, 1, 2), (40, 3, 5), (96, 2, 4)])
def test_param_formula_matches_meta_model(variant, res, d, layers, heads):
    m = ModelConfig(size="tiny", variant=variant, d_model=d, n_layers=layers, n_heads=heads, vocab_size=100,
                    residual=dict(**res))
    model = build_model(m, device="meta")
    shape = sizing.resolve_shape(m)
    assert sum(p.numel() for p in model.parameters()) == sizing.count_params(shape, variant, m.residual)


@pytest.mark.parametrize("variant", NEW)
def test_no_decay_names_exist(variant):
    model = build_model(tiny(variant), device="meta")
    for mod in [model.stream, *model.sites()]:
        names = dict(mod.named_parameters())
        for name in mod.no_decay:
            assert name in names, (variant, name)


def test_params_cli_matches_new_variants_to_review(capsys):
    from rrtrain.cli import params as params_cli

    assert params_cli.main(["--size", "tiny", "--variants", "gr,hc,mhc,attnres,deepnorm,standard",
                            "--match", "review"]) == 0
    out = capsys.readouterr().out
    for name in NEW:
        assert name in out
