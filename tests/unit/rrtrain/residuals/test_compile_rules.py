"""Every residual rule compiles without a graph break in its site, and the multi-stream and depth-aggregating
rules compile to one graph for all blocks of a model (issue 37).

Graph breaks: the transformer block (both sites and both sublayers, as the trainer compiles it) is traced by
dynamo with fullgraph=True, forward and backward, also on a diagnostic step (the gated sites then record their
gate statistics). Graph breaks are found by dynamo's tracing whatever the backend, so the "eager" backend keeps
this fast (no AOT autograd, no code generation; tests/e2e/test_train_single.py trains with inductor end to end).

One graph per block: the blocks of a model of N_BLOCKS blocks are compiled by `prepare_blocks`, the trainer's own
path, with a backend that counts the graphs it is handed ("aot_eager": AOT autograd traces the backward too, no
code generation). N_BLOCKS = 4 shows every block shape at least twice (the rules whose blocks alternate, or whose
first block differs), so a graph per block counts 4, more than any rule's expected 1 or 2; a graph costs the same
to compile at any depth, but a depth-aggregating rule's graph grows with the blocks it reads. Before the fix
AttnRes compiled one graph per block (past dynamo's recompile limit of 8, it then ran eagerly), GR, HC and mHC two
or three (docs/performance.md, "Compile"). Loss and gradients equal the eager model's to 1e-5 over two steps, and
the second step compiles nothing. mHC runs 2 Sinkhorn iterations in both tests (SMALL), not its default 20: the
same loop body, which dynamo unrolls, in a tenth of the graph. Runtime: about 0.5 s per rule for the first test,
1-4 s for the second.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils._pytree import tree_leaves

from rrtrain import residuals
from rrtrain.config import ModelConfig, load_config
from rrtrain.resolve import build_model
from rrtrain.parallel.prepare import prepare_blocks
from rrtrain.residuals import StreamInfo
from rrtrain.residuals.attnres import AttnResStream, Sources, depth_attention

N_BLOCKS = 4
#: knobs that shrink a rule's graph without changing its structure (mHC's Sinkhorn loop, unrolled by dynamo)
SMALL = {"mhc": {"sinkhorn_iters": 2}}


def tiny(variant: str) -> torch.nn.Module:
    torch.manual_seed(0)
    m = ModelConfig(size="tiny", variant=variant, d_model=32, n_layers=1, n_heads=4, d_ff=64, seq_len=8,
                    vocab_size=64, residual=dict(SMALL.get(variant, {})))
    return build_model(m)


def grad_leaves(state) -> list[torch.Tensor]:
    """The tensors of a state (a tensor, or AttnRes's slots and bias) that carry a gradient."""
    return [t for t in tree_leaves(state) if t.requires_grad]


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
        want, got = tree_leaves(block(state)), tree_leaves(compiled(state))
        assert len(want) == len(got)
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        sum(g.float().sum() for g in grad_leaves(got)).backward()
        if record and residuals.get(name).gated:
            assert all(s.stats for s in model.sites())


# label: (overrides, graphs). Block AttnRes of 4 sublayers: blocks alternate between one whose attention opens
# a block and one whose sublayers both add to it, two block shapes, so two graphs.
RULES = {
    "attnres": (["model.variant=attnres"], 1),
    "attnres_block_4": (["model.variant=attnres", "model.residual.attnres_block_size=4"], 2),
    "gr": (["model.variant=gr"], 1),
    "hc": (["model.variant=hc"], 1),
    "hc_static": (["model.variant=hc", "model.residual.hc_dynamic=false"], 1),
    "mhc": (["model.variant=mhc", "model.residual.sinkhorn_iters=2"], 1),
    # a per-block constant (1/sqrt(l)) and a pair state whose two tensors are one at the first block
    "ln_scaling": (["model.variant=ln_scaling"], 1),
    "layer_scalars": (["model.variant=layer_scalars"], 1),
    # one weight per slot, the unread ones masked: one graph; with a period of 2, blocks with and without a DWA
    "denseformer": (["model.variant=denseformer"], 1),
    "denseformer_2x2": (["model.variant=denseformer", "model.residual.denseformer_dilation=2",
                         "model.residual.denseformer_period=2"], 2),
    "laurel_pa": (["model.variant=laurel", "model.residual.laurel_form=pa"], 1),
    # block 0 keeps its values as V_1, the others mix theirs with it
    "value_residual": (["model.variant=value_residual"], 2),
    "frac": (["model.variant=frac"], 1),
    "ngpt": (["model.variant=ngpt"], 1),
    # block 0's attention reads one input, the later ones three (Q, K, V); with the residual way alone, one
    "mudd": (["model.variant=mudd"], 2),
    "mudd_r": (["model.variant=mudd", "model.residual.mudd_ways=r"], 1),
}


def compiled_config(overrides: list[str]):
    shape = [f"model.n_layers={N_BLOCKS}", "model.d_model=32", "model.n_heads=4", "model.d_ff=64",
             "model.seq_len=8", "model.pos=learned", "train.compile=true", "parallel.ac=none"]
    return load_config("configs/train/tiny.yaml", shape + overrides)


@pytest.mark.slow
@pytest.mark.parametrize("label", RULES)
def test_blocks_compile_to_one_graph_per_block_shape(label, monkeypatch):
    overrides, graphs = RULES[label]
    cfg = compiled_config(overrides)
    torch._dynamo.reset()
    eager, model = build_model(cfg.model, vocab_size=64), build_model(cfg.model, vocab_size=64)
    counter = CompileCounterWithBackend("aot_eager")
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_(fn, **{**kw, "backend": counter}))
    prepare_blocks(model, cfg)  # the trainer's path: block.compile() for every block
    gen = torch.Generator().manual_seed(0)
    for step in range(2):
        idx = torch.randint(0, 64, (2, 8), generator=gen)
        want, got = eager(idx, idx.roll(-1, 1)), model(idx, idx.roll(-1, 1))
        want.backward()
        got.backward()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for (name, p), q in zip(eager.named_parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-5, msg=name)
        if step == 0:
            first = counter.frame_count
    assert counter.frame_count == first == graphs  # one graph per block shape, none compiled on the second step


def test_empty_attnres_slots_change_nothing():
    """The masked slots get weight exactly 0: output and gradients equal the plain sources' (float64)."""
    gen = torch.Generator().manual_seed(0)
    sources = [torch.randn(2, 3, 8, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3)]
    query, gain = torch.randn(8, dtype=torch.float64, generator=gen), torch.rand(8, dtype=torch.float64) + 0.5
    # Full AttnRes, 6 sublayers: S = 7 slots
    stream = AttnResStream(StreamInfo(8, 6, 1e-6, residuals.get("attnres").make_knobs()))
    state = stream.expand(sources[0])
    state = Sources(state.slots[2:] + tuple(sources[1:]), torch.cat([state.bias[2:], torch.zeros(2)]))
    assert len(state.slots) == 7
    want = depth_attention(tuple(sources), query, gain, 1e-6)
    got = depth_attention(state.slots, query, gain, 1e-6, state.bias)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-15)
    w_grads = torch.autograd.grad(want.square().sum(), sources)
    g_grads = torch.autograd.grad(got.square().sum(), sources)
    for w, g in zip(w_grads, g_grads):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-15)


@pytest.mark.parametrize("label", ["attnres", "gr", "mhc"])
def test_no_state_is_saved_in_the_checkpoint(label):
    """The state's slots and bias live only in forward: a model's state_dict is its parameters, as before."""
    model = build_model(compiled_config(RULES[label][0]).model, vocab_size=64)
    assert set(model.state_dict()) == {n for n, _ in model.named_parameters()}
