"""The rules of issue 49 (peri_ln, ln_scaling, layer_scalars, laurel and its PA form, denseformer, value_residual)
against independent implementations.

Each peer is written out here from its source (docs/residuals.md, "Rules of 2024-2025", gives each formula and
where it comes from), never from rrtrain's rule: a float64 model with every parameter drawn at random (gains,
scalars and low-rank factors away from their start, so that each one matters) runs its blocks through the rule
and through the peer's forward, with the same attention and MLP modules as F; outputs and the gradients of every
parameter and of the embedding agree to 1e-10. LAuReL's low-rank path is checked against Gemma 3n's
`Gemma3nTextLaurelBlock` itself: its class source is read from the installed transformers at test time and run
(importing transformers' Gemma 3n model takes tens of seconds; its two classes need only torch), to 1e-12, or
1e-6 with its post-norm (Gemma3nRMSNorm computes in float32).
The hand-worked vectors of the docs' "Test vectors" table are checked too; and the `attention_inputs` capability
(value_residual's) with its default `qkv` changes nothing. Runtime: a few seconds.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rrtrain import residuals
from rrtrain.config import ModelConfig
from rrtrain.resolve import build_model
from rrtrain.residuals import SiteInfo
from rrtrain.residuals.laurel import LaurelSite
from rrtrain.residuals.layerscalars import ScalarMixSite
from rrtrain.residuals.lnscaling import LNScaledSite
from rrtrain.residuals.periln import PeriNormSite

F64 = torch.float64
D, T, V, BLOCKS = 8, 5, 16, 3


def tiny(variant: str, **residual) -> nn.Module:
    m = ModelConfig(size="tiny", variant=variant, d_model=D, n_layers=BLOCKS, n_heads=2, d_ff=16, seq_len=T,
                    vocab_size=V, residual=residual)
    model = build_model(m, seed=0).to(F64)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():  # every parameter away from its start, gains around 1
            noise = torch.randn(p.shape, generator=g, dtype=F64)
            p.copy_(1.0 + 0.3 * noise if name.endswith("weight") and p.ndim == 1 else 0.3 * noise)
    return model


def rms(x: torch.Tensor, g, eps: float) -> torch.Tensor:
    """RMSNorm written out: x / sqrt(mean(x²) + eps) · g (g = None: no gain)."""
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if g is None else y * g


def compare(model: nn.Module, peer) -> None:
    """model.hidden(idx) against peer(model, idx), and the gradients of every parameter of a fixed projection
    of both."""
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(3))
    probe = torch.randn(2, T, D, generator=torch.Generator().manual_seed(4), dtype=F64)
    params = dict(model.named_parameters())
    ours = model.hidden(idx)
    g_ours = torch.autograd.grad((ours * probe).sum(), list(params.values()), allow_unused=True)
    theirs = peer(model, idx)
    g_theirs = torch.autograd.grad((theirs * probe).sum(), list(params.values()), allow_unused=True)
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)
    for name, a, b in zip(params, g_ours, g_theirs):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)


def final_norm(model: nn.Module, h: torch.Tensor) -> torch.Tensor:
    return rms(h, model.stream.norm.weight, model.norm_eps)


# ---------------------------------------------------------------------------------------------
# Peri-LN: OLMo-core's PeriNormTransformerBlock.forward (x-transformers' sandwich_norm is the same update)


def peri_ln_peer(model, idx):
    eps, h = model.norm_eps, model.embed(idx, None)
    for b in model.blocks:
        # h = x + post_attention_norm(attention(attention_norm(x)))
        h = h + rms(b.attn(rms(h, b.attn_site.norm.weight, eps)), b.attn_site.out_norm.weight, eps)
        # h + post_feed_forward_norm(feed_forward(feed_forward_norm(h)))
        h = h + rms(b.mlp(rms(h, b.mlp_site.norm.weight, eps)), b.mlp_site.out_norm.weight, eps)
    return final_norm(model, h)


# ---------------------------------------------------------------------------------------------
# LayerNorm Scaling: OLMo-core's LayerNormScaledTransformerBlock (ln_scale = 1 / sqrt(block_idx + 1))


def ln_scaling_peer(model, idx):
    eps, h = model.norm_eps, model.embed(idx, None)
    for block_idx, b in enumerate(model.blocks):
        scale = torch.tensor(1.0 / math.sqrt(block_idx + 1), dtype=torch.float32).to(h.dtype)  # its fp32 buffer
        h = h + b.attn(rms(h, b.attn_site.norm.weight, eps) * scale)
        h = h + b.mlp(rms(h, b.mlp_site.norm.weight, eps) * scale)
    return final_norm(model, h)


# ---------------------------------------------------------------------------------------------
# Layer scalars: nanochat's GPT.forward (x = norm(wte(idx)); x0 = x; x = resid_lambdas[i] * x +
# x0_lambdas[i] * x0; x = block(x); norm(x)); its norms have no gain, rrtrain's pre-norms and final norm keep
# the standard rule's gains (passed here)


def layer_scalars_peer(model, idx):
    eps = model.norm_eps
    x = rms(model.embed(idx, None), None, eps)
    x0 = x
    resid_lambdas = [b.attn_site.resid_lambda for b in model.blocks]
    x0_lambdas = [b.attn_site.x0_lambda for b in model.blocks]
    for i, b in enumerate(model.blocks):
        x = resid_lambdas[i] * x + x0_lambdas[i] * x0
        x = x + b.attn(rms(x, b.attn_site.norm.weight, eps))
        x = x + b.mlp(rms(x, b.mlp_site.norm.weight, eps))
    return final_norm(model, x)


# ---------------------------------------------------------------------------------------------
# LAuReL: the paper's forms (Eqs. of LAUREL-RW, -LR, RW+LR) with f = F(RMSN(·)); the LR term B A x


def laurel_peer(form: str, normed: bool):
    def peer(model, idx):
        eps, x = model.norm_eps, model.embed(idx, None)
        for b in model.blocks:
            for site, branch in ((b.attn_site, b.attn), (b.mlp_site, b.mlp)):
                f = branch(rms(x, site.norm.weight, eps))
                if form != "rw":
                    bax = x @ site.left.weight.T @ site.right.weight.T
                    g = x + (rms(bax, site.lr_norm.weight, eps) if normed else bax)
                else:
                    g = x
                x = site.alpha * f + site.beta * g if form != "lr" else f + g
        return final_norm(model, x)

    return peer


# ---------------------------------------------------------------------------------------------
# DenseFormer: the authors' DWAModules (epfml/DenseFormer, denseformer/denseformer.py), its bookkeeping written out:
# `dilation` accumulators, X_0 = the embedding in accumulator 0; after block i its output goes to accumulator
# (i+1) % dilation at slot (i+1) // dilation and, when (i+1) % period == 0, x = tensordot(alphas[i], that
# accumulator's filled slots); ln_f at the end. Its blocks are the standard pre-norm block.


def denseformer_peer(dilation: int = 1, period: int = 1):
    def peer(model, idx):
        eps, x = model.norm_eps, model.embed(idx, None)
        accumulators = [[] for _ in range(dilation)]
        accumulators[0].append(x)
        for i, b in enumerate(model.blocks):
            x = x + b.attn(rms(x, b.attn_site.norm.weight, eps))
            x = x + b.mlp(rms(x, b.mlp_site.norm.weight, eps))
            accumulators[(i + 1) % dilation].append(x)
            if (i + 1) % period == 0:
                # nn.Linear((i + 1 + dilation) // dilation, 1).weight.view(-1) in the authors' code; rrtrain holds one
                # weight per slot and uses those of the slots the DWA reads (`positions`), oldest first
                alphas = b.mlp_site.alpha[list(b.mlp_site.positions)]
                assert alphas.shape == ((i + 1 + dilation) // dilation,)
                x = torch.tensordot(alphas, torch.stack(accumulators[(i + 1) % dilation]), dims=1)
        return final_norm(model, x)

    return peer


# LAuReL-PA: x_{i+1} = f(x_i) + sum_{j=0}^{k-1} gamma_{i,j} x_{i-j} over the states that exist (i - j >= 0)


def laurel_pa_peer(k: int):
    def peer(model, idx):
        eps, xs = model.norm_eps, [model.embed(idx, None)]
        for i, (site, branch) in enumerate((s, br) for b in model.blocks
                                          for s, br in ((b.attn_site, b.attn), (b.mlp_site, b.mlp))):
            f = branch(rms(xs[i], site.norm.weight, eps))
            xs.append(f + sum(site.gamma[j] * xs[i - j] for j in range(min(i + 1, k))))
        return final_norm(model, xs[-1])

    return peer


# ---------------------------------------------------------------------------------------------
# Value residual: x-transformers' Attention.forward with `value_residual` (add_value_residual=True): the first
# self-attention's values before any mix (`orig_values`) are passed to every later one, which uses
# `value_residual.lerp(v, mix)` (mix 0.5 without learned_value_residual_mix); the paper's learned form
# lambda1 * V_n + lambda2 * V_1. Written with the model's own projections (and rotary, where the model has it).


def value_residual_peer(learned: bool):
    def attention(a, x, value_residual, site):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, a.n_heads, -1).transpose(1, 2) for z in (x @ a.qkv.weight.T).split(d, dim=-1))
        orig_values = v
        if value_residual is not None:
            v = site.lambdas[0] * v + site.lambdas[1] * value_residual if learned else value_residual.lerp(v, 0.5)
        if a.rotary is not None:
            q, k = a.rotary(q), a.rotary(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(b, t, d) @ a.proj.weight.T, orig_values

    def peer(model, idx):
        eps, x, first = model.norm_eps, model.embed(idx, None), None
        for b in model.blocks:
            out, values = attention(b.attn, rms(x, b.attn_site.norm.weight, eps), first, b.attn_site)
            x = x + out
            first = values if first is None else first
            x = x + b.mlp(rms(x, b.mlp_site.norm.weight, eps))
        return final_norm(model, x)

    return peer


# ---------------------------------------------------------------------------------------------
# Frac-connections: lucidrains' HyperConnections(1, dim=d, num_fracs=m) (hyper_connections/hyper_connections.py),
# width_connection and depth_connection step by step with its layouts: fractions split from the width, a stream
# axis of 1, its RMSNorm (F.normalize * sqrt(c) * (gamma + 1)), static_alpha as '(f s) d -> f s d' and its columns
# split as (f2, t); beta = tanh(normed @ dynamic_beta_fn) * scale + static_beta per destination fraction


def frac_peer(m: int):
    def connection(site, branch, h, eps):
        b, t, d = h.shape
        c = d // m
        residuals = h.view(b, t, m, c).unsqueeze(-2)  # 'b ... (f d) -> b ... f d', then '(b s) ... d -> b ... s d'
        normed = F.normalize(residuals, dim=-1) * c ** 0.5 * (site.frac_gain + 1)
        dynamic_alpha = torch.tanh(normed @ site.dynamic_alpha) * site.alpha_scale
        alpha = (dynamic_alpha + site.static_alpha.view(m, 1, 2 * m)).view(b, t, m, 1, m, 2)  # f1 s f2 t
        beta = torch.tanh(normed @ site.dynamic_beta) * site.beta_scale + site.static_beta.view(1, m)  # f1 s f2
        mix_h = torch.einsum("btfsgj,btfsc->btgjc", alpha, residuals)  # '... f1 s f2 t, ... f1 s d -> ... f2 t d'
        branch_input, residuals = mix_h[..., 0, :].reshape(b, t, d), mix_h[..., 1:, :]
        y = branch(rms(branch_input, site.norm.weight, eps))  # rrtrain's pre-norm, inside the branch
        output = torch.einsum("btfc,btfsg->btgsc", y.view(b, t, m, c), beta)  # 'b ... f1 d, b ... f1 s f2 -> ...'
        return output.reshape(b, t, d) + residuals.reshape(b, t, d)

    def peer(model, idx):
        eps, h = model.norm_eps, model.embed(idx, None)
        for b in model.blocks:
            h = connection(b.attn_site, b.attn, h, eps)
            h = connection(b.mlp_site, b.mlp, h, eps)
        return final_norm(model, h)

    return peer


CASES = {
    "frac": ({}, frac_peer(2)),
    "frac_4": ({"frac_fracs": 4}, frac_peer(4)),
    "frac_1": ({"frac_fracs": 1}, frac_peer(1)),
    "value_residual": ({}, value_residual_peer(True)),
    "value_residual_fixed": ({"value_residual_mix": "fixed"}, value_residual_peer(False)),
    "laurel_pa": ({"laurel_form": "pa"}, laurel_pa_peer(3)),
    "laurel_pa_k1": ({"laurel_form": "pa", "laurel_pa_window": 1}, laurel_pa_peer(1)),
    "laurel_pa_k8": ({"laurel_form": "pa", "laurel_pa_window": 8}, laurel_pa_peer(8)),
    "denseformer": ({}, denseformer_peer()),
    "denseformer_k2_p2": ({"denseformer_dilation": 2, "denseformer_period": 2}, denseformer_peer(2, 2)),
    "denseformer_k3": ({"denseformer_dilation": 3}, denseformer_peer(3, 1)),
    "peri_ln": ({}, peri_ln_peer),
    "ln_scaling": ({}, ln_scaling_peer),
    "layer_scalars": ({}, layer_scalars_peer),
    "laurel_lr": ({"laurel_form": "lr", "laurel_rank": 3}, laurel_peer("lr", False)),
    "laurel_lr_norm": ({"laurel_form": "lr", "laurel_rank": 3, "laurel_norm": True}, laurel_peer("lr", True)),
    "laurel_rw": ({"laurel_form": "rw"}, laurel_peer("rw", False)),
    "laurel_rw_lr": ({"laurel_form": "rw_lr", "laurel_rank": 2}, laurel_peer("rw_lr", False)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_rule_matches_its_peer_in_outputs_and_gradients(case):
    knobs, peer = CASES[case]
    variant = case.split("_")[0] if case.startswith(("laurel", "denseformer", "frac")) else case
    compare(tiny("value_residual" if case.startswith("value_residual") else variant, **knobs), peer)


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_value_residual_matches_its_peer_under_rope_too(pos):
    m = ModelConfig(size="tiny", variant="value_residual", d_model=D, n_layers=BLOCKS, n_heads=2, d_ff=16, seq_len=T,
                    vocab_size=V, pos=pos)
    model = build_model(m, seed=0).to(F64)
    with torch.no_grad():
        for b in model.blocks[1:]:
            b.attn_site.lambdas.copy_(torch.tensor([0.7, -0.4], dtype=F64))
    compare(model, value_residual_peer(True))


def test_a_changed_formula_fails_the_peer_comparison():
    """The comparison sees the formula: ln_scaling with a per-sublayer depth (1/sqrt(index + 1)) fails it."""
    model = tiny("ln_scaling")
    for i, site in enumerate(model.sites()):
        site.ln_scale.fill_(1.0 / math.sqrt(i + 1))
    with pytest.raises(AssertionError):
        compare(model, ln_scaling_peer)


# ---------------------------------------------------------------------------------------------
# Gemma 3n's LAuReL block, run from its own source


def gemma3n_classes() -> dict:
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        pytest.skip("transformers is not installed")
    path = Path(spec.origin).parent / "models" / "gemma3n" / "modeling_gemma3n.py"
    if not path.exists():
        pytest.skip(f"this transformers has no Gemma 3n ({path})")
    tree = ast.parse(path.read_text())
    wanted = {"Gemma3nRMSNorm", "Gemma3nTextLaurelBlock"}
    nodes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in wanted]
    assert {n.name for n in nodes} == wanted
    namespace = {"torch": torch, "nn": nn, "F": F, "math": math, "Gemma3nTextConfig": object}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


@pytest.mark.parametrize("normed", [False, True], ids=["plain", "post_norm"])
def test_laurel_low_rank_path_matches_gemma3n_laurel_block(normed):
    """h + y + B A h (plain) and h + y + RMSN(B A h) (laurel_norm) equal Gemma 3n's block on h, plus y; its
    post_laurel_norm replaced by the identity for the plain form. Outputs and gradients (h, y, A, B, gain)."""
    ns = gemma3n_classes()
    d, r, eps = 6, 2, 1e-6
    spec = residuals.get("laurel")
    site = LaurelSite(SiteInfo(d, 0, 4, "attn", eps, spec.make_knobs(laurel_rank=r, laurel_norm=normed))).to(F64)
    peer = ns["Gemma3nTextLaurelBlock"](SimpleNamespace(hidden_size=d, laurel_rank=r, rms_norm_eps=eps)).to(F64)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in (site.left.weight, site.right.weight):
            p.copy_(torch.randn(p.shape, generator=g, dtype=F64))
        peer.linear_left.weight.copy_(site.left.weight)
        peer.linear_right.weight.copy_(site.right.weight)
        if normed:
            site.lr_norm.weight.copy_(1.0 + 0.3 * torch.randn(d, generator=g, dtype=F64))
            peer.post_laurel_norm.weight.copy_(site.lr_norm.weight)
        else:
            peer.post_laurel_norm = nn.Identity()
    h = torch.randn(2, 3, d, generator=g, dtype=F64, requires_grad=True)
    y = torch.randn(2, 3, d, generator=g, dtype=F64, requires_grad=True)
    probe = torch.randn(2, 3, d, generator=g, dtype=F64)
    ours, theirs = site.write(h, y, None), peer(h) + y
    tol = 1e-6 if normed else 1e-12  # Gemma3nRMSNorm computes in float32 whatever the input's dtype
    torch.testing.assert_close(ours, theirs, rtol=tol, atol=tol)
    mine = [h, y, site.left.weight, site.right.weight] + ([site.lr_norm.weight] if normed else [])
    peers = [h, y, peer.linear_left.weight, peer.linear_right.weight] + \
        ([peer.post_laurel_norm.weight] if normed else [])
    for a, b in zip(torch.autograd.grad((ours * probe).sum(), mine), torch.autograd.grad((theirs * probe).sum(), peers)):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------
# Hand-worked vectors (docs/residuals.md, "Test vectors"): d = 2, gains 1, eps 0


def site64(cls, index: int = 0, kind: str = "attn", **knobs):
    spec = residuals.get({PeriNormSite: "peri_ln", LNScaledSite: "ln_scaling", ScalarMixSite: "layer_scalars",
                          LaurelSite: "laurel"}[cls])
    return cls(SiteInfo(2, index, 8, kind, 0.0, spec.make_knobs(**knobs))).to(F64)


def vec(*v) -> torch.Tensor:
    return torch.tensor(v, dtype=F64)[None, None]


def test_hand_worked_vectors():
    h, u = vec(1.0, 2.0), vec(4.0, -4.0)
    torch.testing.assert_close(site64(PeriNormSite).write(h, u, None), vec(2.0, 1.0))  # RMSN(u) = [1, -1]
    x, _ = site64(LNScaledSite, index=3).read(vec(3.0, 4.0))  # block 2: RMSN = [0.8485, 1.1314], / sqrt(2)
    torch.testing.assert_close(x, vec(0.6, 0.8))
    mix = site64(ScalarMixSite, layer_scalars_resid_init=0.5, layer_scalars_x0_init=0.1)
    x, m = mix.read((h, vec(1.0, -1.0)))
    torch.testing.assert_close(m, vec(0.6, 0.9))
    torch.testing.assert_close(mix.write((h, vec(1.0, -1.0)), u, m)[0], vec(4.6, -3.1))
    lr = site64(LaurelSite, laurel_form="lr", laurel_rank=1)
    with torch.no_grad():
        lr.left.weight.copy_(torch.tensor([[1.0, 1.0]]))
        lr.right.weight.copy_(torch.tensor([[1.0], [0.0]]))
    torch.testing.assert_close(lr.write(h, u, None), vec(8.0, -2.0))  # B A h = [3, 0]
    rw = site64(LaurelSite, laurel_form="rw")
    with torch.no_grad():
        rw.alpha.fill_(0.5)
        rw.beta.fill_(2.0)
    torch.testing.assert_close(rw.write(h, u, None), vec(4.0, 2.0))


# ---------------------------------------------------------------------------------------------
# Initialisation


def test_rules_start_where_their_sources_start():
    """laurel (B = 0) and rw (alpha = beta = 1) start as standard; ln_scaling draws its output projections
    without GPT-2's 1/sqrt(2N) (the same draws, times sqrt(2N)) and the rest as standard does."""
    m = ModelConfig(size="tiny", d_model=D, n_layers=BLOCKS, n_heads=2, d_ff=16, seq_len=T, vocab_size=V)
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(3))

    def build(variant: str, **residual) -> nn.Module:
        return build_model(dataclasses.replace(m, variant=variant, residual=residual), seed=5)

    standard = build("standard")
    for variant, knobs in (("laurel", {}), ("laurel", {"laurel_form": "rw"})):
        torch.testing.assert_close(build(variant, **knobs)(idx), standard(idx), rtol=0, atol=0)
    lns = build("ln_scaling")
    for b_std, b_lns in zip(standard.blocks, lns.blocks):
        assert torch.equal(b_std.attn.qkv.weight, b_lns.attn.qkv.weight)
        for p_std, p_lns in ((b_std.attn.proj.weight, b_lns.attn.proj.weight),
                             (b_std.mlp.proj.weight, b_lns.mlp.proj.weight)):
            torch.testing.assert_close(p_lns, p_std * math.sqrt(2 * BLOCKS), rtol=1e-6, atol=0)
    assert [float(s.ln_scale) for s in lns.sites()] == [float(torch.tensor(1 / math.sqrt(i // 2 + 1)))
                                                        for i in range(2 * BLOCKS)]
    scalars = build("layer_scalars")
    assert all(b.attn_site.resid_lambda.item() == 1.0 and b.attn_site.x0_lambda.item() == pytest.approx(0.1)
               for b in scalars.blocks)



# ---------------------------------------------------------------------------------------------
# Costs (docs/residuals.md): parameters over standard, and the planner's FLOPs (6 per rule parameter per token)


def test_parameter_and_flop_costs():
    from rrtrain import sizing

    s = sizing.resolve_shape(ModelConfig(size="rr-60m"))
    d, n_sub, n_blocks, r = s.d_model, s.n_sublayers, s.n_layers, s.d_model // 32
    extra = {"peri_ln": n_sub * d, "ln_scaling": 0, "layer_scalars": 2 * n_blocks, "laurel": n_sub * 2 * d * r}
    base = sizing.flops_per_token(s, "standard", {})
    for name, params in extra.items():
        assert sizing.gate_params(s, name, {}) == params, name
        assert sizing.flops_per_token(s, name, {}) - base == 6 * params, name
    assert sizing.gate_params(s, "laurel", {"laurel_form": "rw"}) == 2 * n_sub
    assert sizing.gate_params(s, "laurel", {"laurel_form": "rw_lr", "laurel_rank": 4}) == n_sub * (8 * d + 2)
    assert sizing.gate_params(s, "laurel", {"laurel_norm": True}) == n_sub * (2 * d * r + d)
    assert sizing.gate_params(s, "laurel", {"laurel_form": "pa"}) == 3 * n_sub
    assert sizing.flops_per_token(s, "laurel", {"laurel_form": "pa"}) - base == 6 * 3 * n_sub + 6 * 3 * d * n_sub
    # DenseFormer: N + 1 weights per DWA, N(N+3)/2 of them used; its weighted sums cost 6 FLOPs per used weight
    # per width on top
    dwa = n_blocks * (n_blocks + 3) // 2
    assert sizing.gate_params(s, "denseformer", {}) == n_blocks * (n_blocks + 1)
    assert sizing.flops_per_token(s, "denseformer", {}) - base == 6 * n_blocks * (n_blocks + 1) + 6 * d * dwa
    # value_residual: 2 per attention after the first; frac (m = 2, c = d/2): c + 2m^2 + 3d + m + 2 per sublayer
    assert sizing.gate_params(s, "value_residual", {}) == 2 * (n_blocks - 1)
    assert sizing.gate_params(s, "value_residual", {"value_residual_mix": "fixed"}) == 0
    assert sizing.flops_per_token(s, "value_residual", {}) - base == 12 * (n_blocks - 1) + 6 * d * (n_blocks - 1)
    assert sizing.gate_params(s, "frac", {}) == n_sub * (d // 2 + 8 + 3 * d + 4)
    assert sizing.flops_per_token(s, "frac", {}) - base == 6 * n_sub * (d // 2 + 8 + 3 * d + 4) + 54 * d * n_sub
    knobs = {"denseformer_dilation": 2, "denseformer_period": 2}
    assert sizing.gate_params(s, "denseformer", knobs) == (n_blocks // 2) * (n_blocks + 1)


def test_denseformer_laurel_pa_and_one_fraction_start_as_standard():
    """Each DWA starts as the identity (the newest output's weight 1), PA with gamma_0 = 1 and frac with one
    fraction as HC with one stream: standard's output, bit for bit, from the same seed."""
    m = ModelConfig(size="tiny", d_model=D, n_layers=BLOCKS, n_heads=2, d_ff=16, seq_len=T, vocab_size=V)
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(3))
    standard = build_model(dataclasses.replace(m, variant="standard"), seed=5)(idx)
    for variant, knobs in (("denseformer", {}), ("denseformer", {"denseformer_dilation": 2, "denseformer_period": 2}),
                           ("laurel", {"laurel_form": "pa"}), ("frac", {"frac_fracs": 1})):
        got = build_model(dataclasses.replace(m, variant=variant, residual=knobs), seed=5)(idx)
        torch.testing.assert_close(got, standard, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# The `attention_inputs` capability (base.py): the block asks the site, never the rule's name


def test_attention_inputs_capability_with_the_default_qkv_changes_nothing():
    """A site that declares the capability but keeps the default `qkv` (project(x) as it is) gives the model's
    output and gradients bit for bit; a `qkv` that changes v changes the output."""
    m = ModelConfig(size="tiny", d_model=D, n_layers=BLOCKS, n_heads=2, d_ff=16, seq_len=T, vocab_size=V)
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(3))
    plain, declared = (build_model(m, seed=5) for _ in range(2))
    for b in declared.blocks:
        b.attn_site.attention_inputs = True
    want, got = plain(idx, idx), declared(idx, idx)
    want.backward()
    got.backward()
    assert torch.equal(want, got)
    for p, q in zip(plain.parameters(), declared.parameters()):
        assert torch.equal(p.grad, q.grad)
    declared.blocks[1].attn_site.qkv = lambda project, x, ctx: (*project(x)[:2], 2 * project(x)[2], ctx)
    assert not torch.equal(declared(idx, idx), want)


def test_frac_starts_where_lucidrains_starts():
    """lucidrains' init in its column order (docs/residuals.md): with m = 2 the sublayer reads fraction 0 in both
    places, the carry keeps the state, and each fraction receives y_0 + y_1."""
    from rrtrain.residuals.frac import FracSite

    site = FracSite(SiteInfo(4, 0, 4, "attn", 0.0, residuals.get("frac").make_knobs())).to(F64)
    h, y = vec(1.0, 2.0, 3.0, 4.0), vec(1.0, -1.0, 0.5, 2.0)
    x, ctx = site.read(h)
    torch.testing.assert_close(x, site.norm(vec(1.0, 2.0, 1.0, 2.0)))
    torch.testing.assert_close(site.write(h, y, ctx), vec(2.5, 3.0, 4.5, 5.0))


@pytest.mark.parametrize("variant, knobs", [("denseformer", {}), ("laurel", {"laurel_form": "pa"}),
                                            ("value_residual", {}), ("frac", {})],
                         ids=["denseformer", "laurel_pa", "value_residual", "frac"])
def test_planner_measures_the_new_rules(variant, knobs):
    """The planner's activation profile runs each (DenseFormer's state nests its slots in a tuple) and its FLOPs add
    the rule's own (`RuleSpec.flops`)."""
    from rrtrain import sizing
    from rrtrain.parallel.memory import activation_profile

    m = ModelConfig(size="tiny", variant=variant, d_model=16, n_layers=2, n_heads=2, d_ff=32, seq_len=8,
                    vocab_size=32, residual=knobs)
    s = sizing.resolve_shape(m)
    prof = activation_profile(m, s, "fp32", False, None)
    assert prof.per_block > 0 and prof.block_input >= 8 * 16 * 4  # value_residual's V_1: a view of block 0's qkv
    own = residuals.get(variant).flops(s.d_model, s.n_sublayers, residuals.get(variant).make_knobs(**knobs))
    assert own > 0
    assert sizing.flops_per_token(s, variant, knobs) == pytest.approx(
        6 * (sizing.backbone_params(s) - s.seq_len * s.d_model * (s.pos == "learned") + sizing.rule_params(
            s, variant, knobs)) + own + 12 * s.n_layers * s.seq_len * s.d_model)
