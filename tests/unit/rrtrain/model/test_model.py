"""The transformer: every registered rule trains (fp32 and bf16), the block equals hand-written
computations at initialisation, GPT-2 initialisation, tied embeddings, fp32 loss, causality, the
meta-device lifecycle, and the rule interface admitting multi-stream and depth-aggregating states.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

import rrtrain.model.transformer
from rrtrain import residuals
from rrtrain.config import ModelConfig
from rrtrain.resolve import build_model
from rrtrain.residuals.norm import RMSNorm
from rrtrain.parallel.materialize import materialize
from rrtrain.residuals import RuleSpec, Site, Stream

V, T, D = 64, 16, 32


def tiny(variant: str = "standard", pos: str = "learned", seed: int = 0, **residual) -> rrtrain.model.transformer.Transformer:
    m = ModelConfig(size="tiny", variant=variant, d_model=D, n_layers=2, n_heads=4, d_ff=64, seq_len=T,
                    vocab_size=V, pos=pos, residual=dict(**residual))
    return build_model(m, seed=seed)


def batch(b: int = 2, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (b, T), generator=g), torch.randint(0, V, (b, T), generator=g)


# ---------------------------------------------------------------------------------------------
# Every registered rule: forward and backward


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", residuals.names())
def test_forward_backward_every_variant(name, dtype):
    model = tiny(name).to(dtype)
    idx, tgt = batch()
    logits = model(idx)
    assert logits.shape == (2, T, V) and logits.dtype == dtype
    loss = model(idx, tgt)
    assert loss.dtype == torch.float32 and loss.ndim == 0
    assert torch.isfinite(loss)
    assert 0.5 * math.log(V) < loss.item() < 2.0 * math.log(V)  # near-uniform prediction at start
    loss.backward()
    nonzero = 0
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{name}: parameter {pname} is not used by the forward pass"
        assert p.grad.dtype == dtype
        assert torch.isfinite(p.grad).all(), f"{name}: non-finite gradient in {pname}"
        nonzero += int(p.grad.abs().max() > 0)
    assert nonzero >= 3
    assert model.tok_emb.weight.grad.abs().max() > 0


@pytest.mark.parametrize("name", ["standard", "review"])
def test_rope_forward_backward(name):
    model = tiny(name, pos="rope")
    assert model.pos_emb is None and model.blocks[0].attn.rotary is not None
    idx, tgt = batch()
    loss = model(idx, tgt)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("name", residuals.names())
def test_causal(name):
    """Changing token t changes no logits before t, whatever the rule (rules mix over depth, never time)."""
    model = tiny(name)
    idx, _ = batch()
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % V
    a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10], rtol=1e-5, atol=1e-5)
    assert (a[:, 10:] - b[:, 10:]).abs().max() > 1e-4


# ---------------------------------------------------------------------------------------------
# Hand-written references at initialisation


def ref_rms_norm(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g


def ref_attention(x: torch.Tensor, w_qkv: torch.Tensor, w_proj: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Causal multi-head attention written out: softmax(QK^T / sqrt(hd) + mask) V, then the projection."""
    b, t, d = x.shape
    q, k, v = (x @ w_qkv.T).split(d, dim=-1)
    q, k, v = (z.view(b, t, n_heads, d // n_heads).transpose(1, 2) for z in (q, k, v))  # (B, H, T, hd)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d // n_heads)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    y = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
    return y.transpose(1, 2).reshape(b, t, d) @ w_proj.T


def ref_mlp(x: torch.Tensor, w_fc: torch.Tensor, w_proj: torch.Tensor) -> torch.Tensor:
    a = x @ w_fc.T
    return (0.5 * a * (1.0 + torch.erf(a / math.sqrt(2.0)))) @ w_proj.T  # exact GELU


def test_standard_equals_handwritten_prenorm_model():
    """`standard`: x + attn(norm1(x)); x + mlp(norm2(x)) per block, final norm, tied head, fp32 CE — by hand."""
    model = tiny("standard").double()
    with torch.no_grad():  # non-trivial gains so that a norm applied in the wrong place shows
        for mod in model.modules():
            if isinstance(mod, RMSNorm):
                mod.weight.uniform_(0.5, 1.5)
    idx, tgt = batch()
    eps = model.blocks[0].attn_site.norm.eps
    x = model.tok_emb.weight[idx] + model.pos_emb.weight[:T]
    for blk in model.blocks:
        x = x + ref_attention(ref_rms_norm(x, blk.attn_site.norm.weight, eps), blk.attn.qkv.weight,
                              blk.attn.proj.weight, 4)
        x = x + ref_mlp(ref_rms_norm(x, blk.mlp_site.norm.weight, eps), blk.mlp.fc.weight, blk.mlp.proj.weight)
    z = ref_rms_norm(x, model.stream.norm.weight, eps)
    logits = z @ model.tok_emb.weight.T
    torch.testing.assert_close(model(idx), logits, rtol=1e-10, atol=1e-10)
    loss = -(logits.log_softmax(-1).gather(-1, tgt[..., None])).mean()
    torch.testing.assert_close(model(idx, tgt), loss.float(), rtol=1e-6, atol=1e-6)


def test_standard_block_uses_sdpa_and_rms_norm_exactly():
    """One fp32 block against F.rms_norm + F.scaled_dot_product_attention on the block's own weights."""
    model = tiny("standard")
    blk = model.blocks[1]
    x = torch.randn(2, T, D)
    d, h = D, 4

    def attn(a: torch.Tensor) -> torch.Tensor:
        q, k, v = F.linear(a, blk.attn.qkv.weight).split(d, dim=-1)
        q, k, v = (z.view(2, T, h, d // h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(y.transpose(1, 2).reshape(2, T, d), blk.attn.proj.weight)

    def mlp(a: torch.Tensor) -> torch.Tensor:
        return F.linear(F.gelu(F.linear(a, blk.mlp.fc.weight)), blk.mlp.proj.weight)

    eps = blk.attn_site.norm.eps
    h1 = x + attn(F.rms_norm(x, (d,), blk.attn_site.norm.weight, eps))
    out = h1 + mlp(F.rms_norm(h1, (d,), blk.mlp_site.norm.weight, eps))
    torch.testing.assert_close(blk(x), out, rtol=1e-6, atol=1e-6)


def test_review_block_is_h_plus_half_u_exactly():
    """At initialisation (W_r = 0, b = 0) Review is exactly h + 0.5 u, bit for bit."""
    model = tiny("review")
    x = torch.randn(2, T, D)
    for blk in model.blocks:
        h1 = x + 0.5 * blk.attn(blk.attn_site.norm(x))
        expected = h1 + 0.5 * blk.mlp(blk.mlp_site.norm(h1))
        assert torch.equal(blk(x), expected)
        x = expected


def test_review_convex_block_is_half_h_plus_half_u():
    model = tiny("review_convex")
    x = torch.randn(2, T, D)
    blk = model.blocks[0]
    h1 = 0.5 * x + 0.5 * blk.attn(blk.attn_site.norm(x))
    expected = 0.5 * h1 + 0.5 * blk.mlp(blk.mlp_site.norm(h1))
    torch.testing.assert_close(blk(x), expected, rtol=1e-6, atol=1e-7)


def test_rezero_stack_is_identity():
    """alpha = 0: every block returns its input unchanged, so the model is norm(embedding) -> tied head."""
    model = tiny("rezero")
    state = torch.randn(2, T, D)
    out = state
    for blk in model.blocks:
        out = blk(out)
    assert torch.equal(out, state)
    idx, _ = batch()
    e = model.tok_emb(idx) + model.pos_emb.weight[:T]
    assert torch.equal(model.hidden(idx), model.stream.norm(e))


def test_rope_is_a_rotation_of_channel_pairs():
    """RoPE: channel pairs (2i, 2i+1) at position p rotated by p * base^(-2i/hd), as complex multiplication."""
    model = tiny("standard", pos="rope")
    rot = model.blocks[0].attn.rotary
    hd = D // 4
    x = torch.randn(2, 4, T, hd)
    freqs = 10000.0 ** (-torch.arange(0, hd, 2).double() / hd)
    angles = torch.arange(T).double()[:, None] * freqs[None, :]
    xc = torch.view_as_complex(x.double().view(2, 4, T, hd // 2, 2).contiguous())
    expected = torch.view_as_real(xc * torch.polar(torch.ones_like(angles), angles)).flatten(-2)
    torch.testing.assert_close(rot(x).double(), expected, rtol=1e-5, atol=1e-5)
    # relative: q.k depends only on the offset
    q, k = torch.randn(1, 1, 1, hd).expand(1, 1, T, hd), torch.randn(1, 1, 1, hd).expand(1, 1, T, hd)
    dots = (rot(q)[..., 3:, :] * rot(k)[..., :-3, :]).sum(-1)
    torch.testing.assert_close(dots, dots[..., :1].expand_as(dots), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# GPT-2 initialisation, tied embeddings, fp32 loss


def test_gpt2_initialisation():
    """N(0, 0.02) everywhere except the output projections, N(0, 0.02 / sqrt(2 * n_layers)).

    Big enough (d = 256, 6 blocks) that each matrix's sample std lies within 3% of its target (the
    smallest, 256 x 256, has a standard error of 0.3%); a missing residual scaling is off by 3.5x.
    """
    n = 6
    model = build_model(ModelConfig(size="tiny", variant="review", d_model=256, n_layers=n, n_heads=4, d_ff=1024,
                                    seq_len=256, vocab_size=1024))
    small = 0.02 / math.sqrt(2 * n)

    def check(w: torch.Tensor, std: float, what: str) -> None:
        assert w.float().std().item() == pytest.approx(std, rel=0.03), what
        assert abs(w.float().mean().item()) < 0.05 * std, what

    check(model.tok_emb.weight, 0.02, "tok_emb")
    check(model.pos_emb.weight, 0.02, "pos_emb")
    for i, blk in enumerate(model.blocks):
        check(blk.attn.qkv.weight, 0.02, f"block {i} qkv")
        check(blk.mlp.fc.weight, 0.02, f"block {i} fc")
        check(blk.attn.proj.weight, small, f"block {i} attn.proj")
        check(blk.mlp.proj.weight, small, f"block {i} mlp.proj")
        for site in (blk.attn_site, blk.mlp_site):
            assert torch.all(site.norm.weight == 1)
            assert torch.all(site.gate.proj.weight == 0) and torch.all(site.gate.bias == 0)
    assert torch.all(model.stream.norm.weight == 1)


def test_init_std_config():
    model = build_model(ModelConfig(size="tiny", d_model=128, n_layers=2, n_heads=2, vocab_size=512,
                                    init_std=0.05))
    assert model.tok_emb.weight.std().item() == pytest.approx(0.05, rel=0.03)
    assert model.blocks[0].attn.proj.weight.std().item() == pytest.approx(0.05 / 2, rel=0.05)


def test_tied_embeddings():
    model = tiny("standard")
    # outside the blocks, one (V, D) matrix: the LM head is the token embedding
    assert [n for n, p in model.named_parameters() if p.shape == (V, D) and not n.startswith("blocks.")] \
        == ["tok_emb.weight"]
    idx, _ = batch()
    torch.testing.assert_close(model(idx), model.hidden(idx) @ model.tok_emb.weight.T, rtol=0, atol=0)
    # a token that is only ever a target still gets gradient on its embedding row (through the head)
    idx = torch.zeros(1, T, dtype=torch.long)
    tgt = torch.full((1, T), 7)
    model(idx, tgt).backward()
    assert model.tok_emb.weight.grad[7].abs().max() > 0
    assert model.tok_emb.weight.grad[7:8].norm() > 10 * model.tok_emb.weight.grad[8:].norm(dim=1).max()


def test_loss_is_fp32_cross_entropy_even_in_bf16():
    model = tiny("review").to(torch.bfloat16)
    idx, tgt = batch()
    loss = model(idx, tgt)
    assert loss.dtype == torch.float32
    expected = F.cross_entropy(model(idx).float().flatten(0, 1), tgt.flatten())
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    tgt[:, :5] = -1  # ignored positions
    expected = F.cross_entropy(model(idx).float()[:, 5:].flatten(0, 1), tgt[:, 5:].flatten())
    torch.testing.assert_close(model(idx, tgt), expected, rtol=1e-6, atol=1e-6)


def test_same_seed_same_model():
    a, b, c = tiny("review", seed=3), tiny("review", seed=3), tiny("review", seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["tok_emb.weight"], sc["tok_emb.weight"])


@pytest.mark.parametrize("name", residuals.names())
def test_meta_build_then_init_weights_matches_cpu(name):
    """The FSDP lifecycle: build on meta, to_empty, init_weights — the same weights (and buffers) as on CPU."""
    pos = "rope" if name in ("standard", "review") else "learned"
    m = ModelConfig(size="tiny", variant=name, d_model=D, n_layers=2, n_heads=4, d_ff=64, seq_len=T,
                    vocab_size=V, pos=pos)
    cpu = build_model(m, seed=11)
    meta = build_model(m, device="meta")
    assert all(p.is_meta for p in meta.parameters())
    meta.to_empty(device="cpu")
    meta.init_weights(11)
    for (n1, t1), (n2, t2) in zip(list(cpu.named_parameters()) + list(cpu.named_buffers()),
                                  list(meta.named_parameters()) + list(meta.named_buffers())):
        assert n1 == n2
        assert torch.equal(t1, t2), f"{name}: {n1} differs after meta -> to_empty -> init_weights"



@pytest.mark.parametrize("name", residuals.names())
def test_materialize_unit_by_unit_matches_a_whole_build(name):
    """Training's path in one process (meta -> materialize: each unit drawn whole on a template from its own
    generator, then copied) gives the same bits as a model built and initialised whole, buffers included."""
    m = ModelConfig(size="tiny", variant=name, d_model=D, n_layers=3, n_heads=4, d_ff=64, seq_len=T,
                    vocab_size=V, pos="rope" if name == "standard" else "learned")
    whole, meta = build_model(m, seed=4), build_model(m, device="meta")
    materialize(meta, torch.device("cpu"), seed=4)
    a = [*whole.named_parameters(), *whole.named_buffers()]
    b = [*meta.named_parameters(), *meta.named_buffers()]
    assert [n for n, _ in a] == [n for n, _ in b]
    for (n, t1), (_, t2) in zip(a, b):
        assert torch.equal(t1, t2), f"{name}: {n}"


def test_each_unit_has_its_own_stream():
    """A unit's weights depend on the seed and its index only: initialising the units in another order gives
    the same model, and two blocks do not start alike."""
    model = tiny("mhc", seed=2)
    again = build_model(ModelConfig(size="tiny", variant="mhc", d_model=D, n_layers=2, n_heads=4, d_ff=64,
                                    seq_len=T, vocab_size=V), device="meta").to_empty(device="cpu")
    for u in reversed(range(again.n_units)):
        again.init_unit(u, again.unit(u), rrtrain.model.transformer.unit_generator(2, u))
    for (n, t1), (_, t2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(t1, t2), n
    b0, b1 = model.blocks
    assert not torch.equal(b0.attn.qkv.weight, b1.attn.qkv.weight)
    assert not torch.equal(b0.attn_site.phi, b1.attn_site.phi)

# ---------------------------------------------------------------------------------------------
# The interface: the block never looks at the rule, and non-tensor / multi-stream states fit


def test_model_never_branches_on_a_rule_name():
    source = inspect.getsource(rrtrain.model.transformer)
    for name in residuals.names():
        assert f'"{name}"' not in source and f"'{name}'" not in source, name


class _TwoStream(Stream):
    """Toy multi-stream rule: state (B, T, 2, D); the second stream only ever holds the embedding."""

    def __init__(self, info):
        super().__init__(info)
        self.norm = RMSNorm(info.d_model, info.eps)

    def expand(self, e):
        return torch.stack([e, e], dim=-2)

    def readout(self, state):
        return self.norm(state.mean(-2))

    def reset_parameters(self, generator=None):
        self.norm.reset_parameters()


class _TwoSite(Site):
    def __init__(self, info):
        super().__init__(info)
        self.norm = RMSNorm(info.d_model, info.eps)

    def read(self, state):
        return self.norm(state[..., 0, :]), None

    def write(self, state, y, ctx):
        return torch.stack([state[..., 0, :] + y, state[..., 1, :]], dim=-2)

    def reset_parameters(self, generator=None):
        self.norm.reset_parameters()


class _DepthStream(Stream):
    """Toy depth-aggregating rule: the state is the tuple of all earlier outputs (embedding first)."""

    def expand(self, e):
        return (e,)

    def readout(self, state):
        return sum(state)

    def reset_parameters(self, generator=None):
        pass


class _DepthSite(Site):
    def __init__(self, info):
        super().__init__(info)
        self.norm = RMSNorm(info.d_model, info.eps)

    def read(self, state):
        return self.norm(sum(state)), len(state)

    def write(self, state, y, ctx):
        assert ctx == len(state)
        return state + (y,)

    def reset_parameters(self, generator=None):
        self.norm.reset_parameters()


def test_multi_stream_and_tuple_states_pass_through_the_block(monkeypatch):
    """A (B, T, n, D) state and a tuple-of-tensors state run through the unchanged Block."""
    seen = []
    for name, stream, site, check in (
        ("_toy_two_stream", _TwoStream, _TwoSite, lambda s: s.shape == (2, T, 2, D)),
        ("_toy_depth", _DepthStream, _DepthSite,
         lambda s: isinstance(s, tuple) and all(x.shape == (2, T, D) for x in s)),
    ):
        spec = RuleSpec(name=name, site=site, stream=stream, params=lambda d, n, cfg: 0, summary="toy")
        monkeypatch.setitem(residuals._RULES, name, spec)
        model = tiny(name)
        states = []
        for blk in model.blocks:
            blk.register_forward_pre_hook(lambda mod, args: states.append(args[0]))
        idx, tgt = batch()
        loss = model(idx, tgt)
        loss.backward()
        assert torch.isfinite(loss) and len(states) == 2 and all(check(s) for s in states), name
        assert model.blocks[0].attn.qkv.weight.grad.abs().max() > 0
        seen.append(states)
    # the depth-aggregating state grows by two outputs per block
    assert [len(s) for s in seen[1]] == [1, 3]
