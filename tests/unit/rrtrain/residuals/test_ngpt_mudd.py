"""nGPT and MUDDFormer (issue 49) against their authors' code, and nGPT's optimizer-side hook.

Each peer is the reference's forward written out here in its own conventions (docs/residuals.md maps them), run
on a float64 model whose every rule parameter is drawn away from its start, with the model's own attention weights,
rotary tables and MLP as the sublayers: outputs and the gradients of every parameter agree to 1e-10.
    nGPT   NVIDIA/ngpt `model.py`, `Block.forward` and `GPT.forward` (use_nGPT=1): `justnorm` without an epsilon,
           the rotation before `sqk`, the scaled parameters `θ · init / scaling`, logits `sz · lm_head(x)`
    MUDD   Caiyun-AI/MUDDFormer `pytorch/muddformer/modeling_muddformer.py`: `MUDDFormer.forward` (hiddens, the
           dynamic weights `dw` as 'B T (C L) -> C B T L' plus `dense_bs`, `einsum('LBTD, CBTL -> CBTD')`, the last
           layer's single way, `x[0]` before the final norm), `TransformerBlock.forward` with `sepln`,
           `MultiwayDynamicDenseBlock` (its `RMSnormNoscale`, `w1`, GELU, `w2`), its own per-block widths
The hook: an optimizer step (training's `optimizer_step` on the `none` engine) leaves every matrix nGPT names on
the unit sphere; a skipped step leaves every weight as it was. Runtime: about 4 s.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from rrtrain import residuals, sizing
from rrtrain.config import Config, ModelConfig
from rrtrain.core.dist import DistInfo
from rrtrain.parallel import build_training_engine
from rrtrain.parallel.engine import Engine
from rrtrain.resolve import build_model, resolve
from rrtrain.residuals import SiteInfo
from rrtrain.residuals.mudd import hidden, hidden_of
from rrtrain.residuals.ngpt import NGPTAttnSite, after_step
from rrtrain.training.step import optimizer_step

F64 = torch.float64
D, T, V = 8, 5, 16


def model64(variant: str, n_layers: int = 3, pos: str = "learned", **residual) -> torch.nn.Module:
    """A float64 model with every parameter moved off its start: 1-D gains near 1, the rest N(0, 0.3²)."""
    m = ModelConfig(size="tiny", variant=variant, d_model=D, n_layers=n_layers, n_heads=2, d_ff=16, seq_len=T,
                    vocab_size=V, pos=pos, residual=residual)
    model = build_model(m, seed=0).to(F64)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            z = torch.randn(p.shape, generator=g, dtype=F64)
            p.copy_(1.0 + 0.3 * z if p.ndim == 1 and name.endswith("norm.weight") else 0.3 * z)
    return model


def agree(model: torch.nn.Module, peer, fold=lambda name, g: g) -> None:
    """`model.hidden` and `peer(model, idx)`: values, and the gradients of every parameter of <out, probe> (each as
    `fold(name, gradient)` gives it)."""
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(2))
    probe = torch.randn(2, T, D, generator=torch.Generator().manual_seed(3), dtype=F64)
    names, params = zip(*model.named_parameters())
    outs = [model.hidden(idx), peer(model, idx)]
    grads = [torch.autograd.grad((o * probe).sum(), params, allow_unused=True) for o in outs]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-10, atol=1e-10)
    for name, a, b in zip(names, *grads):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(fold(name, a), fold(name, b), rtol=1e-10, atol=1e-10, msg=name)


def heads(z: torch.Tensor, n: int) -> torch.Tensor:
    """(B, T, D) -> (B, T, H, hd), the references' layout before attention."""
    return z.view(*z.shape[:-1], n, -1)


def rotate(a, z: torch.Tensor) -> torch.Tensor:
    """The model's own rotary tables on (B, T, H, hd), where it has them (the references' own tables differ in
    layout only)."""
    return z if a.rotary is None else a.rotary(z.transpose(1, 2)).transpose(1, 2)


def attend(a, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention over (B, T, H, hd) inputs, then the attention's output projection."""
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                       scale=scale)
    return y.transpose(1, 2).flatten(-2) @ a.proj.weight.T


# ---------------------------------------------------------------------------------------------
# nGPT: NVIDIA/ngpt model.py (use_nGPT=1). Its MLP is a SwiGLU with `suv` (2·4d) on c_fc's output times √n_embd;
# rrtrain's is a GELU MLP, so the same scaling on its one hidden layer, one learned scalar (docs/residuals.md)


def justnorm(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(p=2, dim=-1, keepdim=True)


def ngpt_peer(model, idx):
    base = 1.0 / math.sqrt(D)  # config.base_scale; every *_init_scaling but suv's
    # x = tok_emb: NVIDIA's rows are unit after normalize_matrices; rrtrain normalises the embedding sum (learned
    # positions), the one step taken from rrtrain's side
    h = justnorm(model.embed(idx, None))
    for blk in model.blocks:
        a, site = blk.attn, blk.attn_site
        q, k, v = (heads(z, a.n_heads) for z in (h @ a.qkv.weight.T).split(D, dim=-1))
        q, k = rotate(a, q), rotate(a, k)  # apply_rotary_position_embeddings, then sqk
        sqk = (site.sqk * (1.0 / base)).view(1, 1, a.n_heads, -1)
        q, k = sqk * justnorm(q), sqk * justnorm(k)
        h_att = attend(a, q, k, v, scale=q.shape[-1] ** 0.5)  # softmax_scale = sqrt_head_dim
        lr = torch.abs(site.alpha * (0.05 / base))
        A_norm, B_norm = justnorm(h), justnorm(h_att)
        h = justnorm(A_norm + lr * (B_norm - A_norm))
        m, site = blk.mlp, blk.mlp_site
        uv = (h @ m.fc.weight.T) * (site.su * ((1.0 / 1.0) * D ** 0.5))  # suv * (init / scaling * sqrt(n_embd))
        h_mlp = F.gelu(uv) @ m.proj.weight.T
        lr = torch.abs(site.alpha * (0.05 / base))
        A_norm, B_norm = justnorm(h), justnorm(h_mlp)
        h = justnorm(A_norm + lr * (B_norm - A_norm))
    return model.stream.sz * (1.0 / base) * h  # logits = sz * lm_head(x), the head tied here


def rotate_after_scaling_is_the_same(model) -> None:
    """s_qk equal within each rotated pair (2i, 2i + 1), so rotating before or after it is the same; and the rotary
    tables in float64: NVIDIA normalises q after the rotation, rrtrain before, the same only where the rotation
    keeps norms (rrtrain's tables are drawn in fp32, whose cos² + sin² is 1 to ~1e-7)."""
    with torch.no_grad():
        for blk in model.blocks:
            s = blk.attn_site.sqk
            s.copy_(s.view(-1, 2)[:, :1].expand(-1, 2).reshape(-1).clone())
            r = blk.attn.rotary
            inv = 1.0 / (r.base ** (torch.arange(0, r.head_dim, 2, dtype=F64) / r.head_dim))
            angles = torch.outer(torch.arange(r.seq_len, dtype=F64), inv)
            r.cos.copy_(angles.cos())
            r.sin.copy_(angles.sin())


def pair_sums(name: str, g: torch.Tensor) -> torch.Tensor:
    """s_qk's gradient summed over each rotated pair: the rotation moves it within the pair (one value per pair)."""
    return g.view(-1, 2).sum(-1) if name.endswith("sqk") else g


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_ngpt_matches_nvidia(pos):
    model = model64("ngpt", pos=pos)
    if pos == "rope":
        rotate_after_scaling_is_the_same(model)
    agree(model, ngpt_peer, pair_sums if pos == "rope" else lambda name, g: g)


def test_ngpt_scales_qk_before_the_rotation():
    """The one convention apart: rrtrain's s_qk acts before RoPE (lucidrains' order), NVIDIA's after; with an s_qk
    that differs within a rotated pair the outputs differ."""
    model = model64("ngpt", pos="rope")
    rotate_after_scaling_is_the_same(model)
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn_site.sqk[1::2].mul_(-2.0)
    with pytest.raises(AssertionError):
        agree(model, ngpt_peer)


def test_ngpt_start_and_hand_worked_update():
    """NVIDIA's start (|α| = 0.05, s_qk = 1, s_u = √d on the hidden layer, s_z = 1, every matrix on the sphere), and
    h = [1, 0], y = [0, 2], |α| = 0.5: N(h + 0.5 (N(y) - h)) = [1, 1]/√2."""
    model = build_model(ModelConfig(size="tiny", variant="ngpt", d_model=D, n_layers=2, n_heads=2, d_ff=16,
                                    seq_len=T, vocab_size=V), seed=1)
    site, mlp = model.blocks[0].attn_site, model.blocks[0].mlp_site
    assert torch.allclose(site.alpha * 0.05 * math.sqrt(D), torch.full((D,), 0.05))
    assert torch.allclose(site.sqk * math.sqrt(D), torch.ones(D)) and mlp.su.item() == 1.0
    assert model.stream.sz.item() * math.sqrt(D) == pytest.approx(1.0)
    for weight, edit in after_step(model):
        torch.testing.assert_close(edit(weight), weight, rtol=1e-6, atol=1e-6)
    spec = residuals.get("ngpt")
    half = NGPTAttnSite(SiteInfo(2, 0, 4, "attn", 1e-6, spec.make_knobs(ngpt_alpha_init=0.5))).to(F64)
    h, y = torch.tensor([[[1.0, 0.0]]], dtype=F64), torch.tensor([[[0.0, 2.0]]], dtype=F64)
    torch.testing.assert_close(half.write(h, y, None), torch.tensor([[[0.5 ** 0.5, 0.5 ** 0.5]]], dtype=F64))


CPU = DistInfo(0, 1, 0, torch.device("cpu"))


def ngpt_engine(**train):
    cfg = Config()
    cfg.model = ModelConfig(size="tiny", variant="ngpt", d_model=16, n_layers=2, n_heads=2, d_ff=32, seq_len=8,
                            vocab_size=32)
    cfg.train = dataclasses.replace(cfg.train, compile=False, **train)
    run = resolve(cfg)
    return build_training_engine(cfg, run.shape, CPU, rule=run.rule)


def test_ngpt_step_puts_the_matrices_back_on_the_sphere_and_a_skipped_step_changes_nothing():
    """Training's own step: after it, the embedding's and input layers' rows and the output projections' columns
    have unit norm (they would not without the hook: the step moved them off); a non-finite step changes no bit."""
    engine = ngpt_engine(lr=0.05, weight_decay=0.0)
    rows = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(0))
    named = dict(engine.inner.named_parameters())
    edited = {id(p) for p, _ in after_step(engine.inner)}
    assert {n for n, p in named.items() if id(p) in edited} == {"tok_emb.weight"} | {
        f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")}
    before = {n: p.detach().clone() for n, p in named.items()}
    optimizer_step(engine, iter([rows]), 1, 0.05, 1.0, CPU)
    for p, edit in after_step(engine.inner):
        torch.testing.assert_close(edit(p), p, rtol=1e-6, atol=1e-6)
    assert all(not torch.equal(before[n], p) for n, p in named.items() if id(p) in edited)
    after = {n: p.detach().clone() for n, p in named.items()}
    out = optimizer_step(engine, iter([rows]), 1, 0.05, 1.0, CPU, poison=True)
    assert out.nonfinite.item() == 1.0
    assert all(torch.equal(after[n], p) for n, p in named.items())


def test_engine_hook_is_the_rules_and_off_for_the_others():
    """`Engine.after_step` edits what the rule's hook names, and nothing for a rule without one."""
    engine = Engine()
    engine.inner = build_model(ModelConfig(size="tiny", variant="standard", d_model=D, n_layers=1, n_heads=2,
                                           d_ff=16, seq_len=T, vocab_size=V), seed=0)
    state = {k: v.clone() for k, v in engine.inner.state_dict().items()}
    engine.after_step()
    assert all(torch.equal(state[k], v) for k, v in engine.inner.state_dict().items())
    engine.inner = build_model(ModelConfig(size="tiny", variant="ngpt", d_model=D, n_layers=1, n_heads=2, d_ff=16,
                                           seq_len=T, vocab_size=V), seed=0)
    with torch.no_grad():
        engine.inner.blocks[0].attn.proj.weight.mul_(3.0)
    engine.after_step(torch.tensor(1.0))
    assert torch.linalg.vector_norm(engine.inner.blocks[0].attn.proj.weight, dim=0).min() > 2.9
    engine.after_step(torch.tensor(0.0))
    torch.testing.assert_close(torch.linalg.vector_norm(engine.inner.blocks[0].attn.proj.weight, dim=0),
                               torch.ones(D))


# ---------------------------------------------------------------------------------------------
# MUDDFormer: the authors' PyTorch model (dense=True, dynamic_dense=True, sepln=True, round64, expand_last), with
# rrtrain's sublayers; its per-block parameters are the slices of rrtrain's held ones at the block's own widths


def mudd_parameters(site, i: int, n: int, c: int):
    """w1 (hid, d), w2 (C·L, hid) in 'B T (C L)' order, dense_bs (C, L) of block i, as the authors' shapes."""
    hid, ways, length = hidden_of(i, n, site.info.cfg), 1 if i == n - 1 else c, i + 2
    s = site.slots
    w2 = site.dense_out.weight.view(c, s, -1)[c - ways:, s - length:, :hid].reshape(ways * length, hid)
    return site.dense_in.weight[:hid], w2, site.dense_bias[c - ways:, s - length:], ways


def rms_noscale(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rms(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    return rms_noscale(x, eps) * g


def mudd_peer(ways: str):
    c = len(ways)

    def peer(model, idx):
        eps, n = model.norm_eps, len(model.blocks)
        x = model.embed(idx, None)
        hiddens = [x]
        for i, blk in enumerate(model.blocks):
            a, site = blk.attn, blk.attn_site
            if i == 0 or c == 1:  # res = x; normed_x = attention_norm(x); xq = xk = xv
                res = x[-1] if i > 0 else x
                xq = xk = xv = rms(res, site.norm.weight, eps)
            else:  # res = x[-1]; a norm per input, then wq, wk, wv on x[0], x[1], x[2]
                res = x[-1]
                xq, xk, xv = (rms(z, g, eps) for z, g in zip(x[:3], (site.norm.weight, site.norm_k.weight,
                                                                       site.norm_v.weight)))
            wq, wk, wv = a.qkv.weight.split(D)
            q, k, v = heads(xq @ wq.T, a.n_heads), heads(xk @ wk.T, a.n_heads), heads(xv @ wv.T, a.n_heads)
            h = res + attend(a, rotate(a, q), rotate(a, k), v, scale=q.shape[-1] ** -0.5)
            out = h + blk.mlp(rms(h, blk.mlp_site.norm.weight, eps))
            hiddens.append(out)
            w1, w2, dense_bs, ways_i = mudd_parameters(blk.mlp_site, i, n, c)
            dw = F.gelu(rms_noscale(out, eps) @ w1.T) @ w2.T  # B T (C L)
            dw = dw.view(*dw.shape[:-1], ways_i, i + 2).permute(2, 0, 1, 3)  # C B T L
            dw = dw + dense_bs[:, None, None, :]
            x = torch.einsum("LBTD, CBTL -> CBTD", torch.stack(hiddens), dw)
        x = x[0]  # the last layer's one way
        return rms(x, model.stream.norm.weight, eps)

    return peer


@pytest.mark.parametrize("ways, n_layers", [("qkvr", 3), ("r", 3), ("qkvr", 16)], ids=["qkvr", "r", "qkvr_16_blocks"])
def test_mudd_matches_the_authors_model(ways, n_layers):
    """16 blocks: W_1's width differs from block to block (64 up to block 13, then 128), the held one is masked."""
    model = model64("mudd", n_layers=n_layers, mudd_ways=ways)
    agree(model, mudd_peer(ways))


def test_mudd_matches_under_rope():
    agree(model64("mudd", pos="rope"), mudd_peer("qkvr"))


def test_mudd_widths_and_start():
    """The authors' widths (round64 past the multiple, x4 in the last block) and a start that is `standard`'s model."""
    knobs = residuals.get("mudd").make_knobs()
    assert [hidden_of(i, 16, knobs) for i in (0, 13, 14, 15)] == [64, 64, 128, 128] and hidden(12, knobs) == 64
    m = ModelConfig(size="tiny", d_model=16, n_layers=3, n_heads=2, d_ff=32, seq_len=T, vocab_size=V)
    idx = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    for ways in ("qkvr", "r"):
        got = build_model(dataclasses.replace(m, variant="mudd", residual={"mudd_ways": ways}), seed=4)(idx)
        want = build_model(dataclasses.replace(m, variant="standard"), seed=4)(idx)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Costs: parameters over standard, the planner's FLOPs and its traced activations


def test_costs():
    s = sizing.resolve_shape(ModelConfig(size="rr-60m"))
    d, n = s.d_model, s.n_layers
    assert sizing.gate_params(s, "ngpt", {}) == n * (d + 1) + 1 - d
    assert sizing.flops_per_token(s, "ngpt", {}) - sizing.flops_per_token(s, "standard", {}) == \
        6 * sizing.gate_params(s, "ngpt", {})
    h, slots = hidden(n, residuals.get("mudd").make_knobs()), n + 1
    extra = 2 * d * (n - 1) + n * (d * h + h * 4 * slots + 4 * slots)  # two more norms after block 0
    assert sizing.gate_params(s, "mudd", {}) == extra
    assert sizing.flops_per_token(s, "mudd", {}) - sizing.flops_per_token(s, "standard", {}) == \
        6 * extra + 6 * d * 4 * n * (n + 3) // 2
    assert sizing.gate_params(s, "mudd", {"mudd_ways": "r"}) == n * (d * h + h * slots + slots)


def test_planner_traces_both_rules():
    """The planner's activation profile runs each rule's model (fake tensors): each block keeps more than a
    `standard` block (nGPT's normalisations, MUDD's four inputs and their norms; docs/residuals.md has figures)."""
    from rrtrain.parallel.memory import activation_profile

    per_block, block_input = {}, {}
    for variant in ("standard", "ngpt", "mudd"):
        m = ModelConfig(size="tiny", variant=variant, d_model=16, n_layers=2, n_heads=2, d_ff=32, seq_len=8,
                        vocab_size=32)
        prof = activation_profile(m, sizing.resolve_shape(m), "fp32", False, None)
        per_block[variant], block_input[variant] = prof.per_block, prof.block_input
    assert per_block["ngpt"] > per_block["standard"] and per_block["mudd"] > per_block["standard"]
    # what a checkpointed block keeps: its input state's new tensors, one [8, 16] fp32 stream for a single-stream
    # rule; for MUDD the next block's four inputs (Q, K, V, R) and the newest slot
    stream = 8 * 16 * 4
    assert block_input == {"standard": stream, "ngpt": stream, "mudd": 5 * stream}

