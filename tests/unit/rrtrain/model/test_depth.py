"""The paper's depth finding, measured at initialisation: `review_convex` against `review` at 40 sublayers.

Setup: 20 blocks (40 sublayers), d_model = 64, 4 heads, d_ff = 256, learned positions, byte-level vocabulary
(256 byte values + 1), sequences of 64 bytes; a batch of 8 windows of the children's story below, the same
seed for both rules (so every shared weight is identical).

(a) Gradient ratio  G = ||dL/d theta_0|| / ||dL/d theta_{B-1}||,  theta_b = every parameter of block b
    (attention, MLP and the block's two residual sites: norms and gates), L the mean next-byte
    cross-entropy of the batch, B the number of blocks. `review` and `review_convex` have the same
    parameters, so the two ratios compare like with like. (`state_ratio` also gives
    ||dL/dh_in(block 0)|| / ||dL/dh_in(block B-1)|| for the residual state entering each block.)
(b) Skip-path weight: with every sublayer's output projection zeroed (so each u = 0 and dU/dh = 0), the
    Jacobian dh_L/dh_0 of the final residual state with respect to the state entering block 0 is applied
    to random directions by autograd (a Jacobian-vector product); it must equal w * I. The convex form gives
    w = (1 - 0.5)^40 = 2^-40 = 9.09e-13, the additive form w = 1.

What this shows (docs/depth.md): the convex form's forward skip path decays as 0.5^L, but the gradient
ratio at initialisation does NOT collapse as 0.5^L, because each sublayer's RMSNorm divides by the norm of
its (shrinking) input, so the branch paths amplify what the skip path loses. `python tests/unit/rrtrain/model/test_depth.py`
prints the table in docs/depth.md.
"""

from __future__ import annotations

import statistics
import sys

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from rrtrain.config import ModelConfig
from rrtrain.model.transformer import Transformer
from rrtrain.resolve import build_model

STORY = """\
Once upon a time, in a small house at the edge of a big green wood, there lived a little girl named Pia and
her grey cat, Button. Every morning Pia opened the round window and said hello to the sun, and every morning
Button yawned and said nothing at all, because cats do not like to be hurried.

One day a strong wind came down the hill. It shook the apple tree and rattled the door, and when it was gone,
Pia's red kite was gone too. "Oh no," said Pia. "My kite has flown away into the wood." Button looked at the
empty hook on the wall. Then he looked at Pia. Then he walked to the door and sat down beside it, which is
what a cat does when he thinks it is time for an adventure.

So Pia put on her yellow boots and her blue coat, and the two of them went into the wood. The trees were tall
and the path was soft with leaves. A robin sang on a branch. "Have you seen a red kite?" Pia asked. The robin
tilted its head and flew a little way ahead, then waited, then flew again. "I think he wants us to follow,"
said Pia, and they did.

They came to a stream where a family of ducks was swimming in a line. The smallest duck was having trouble
with the current, so Pia picked up a long stick and held it out, and the little duck climbed onto it and
paddled back to his mother. The mother duck quacked a thank you. Button pretended he had not been thinking
about ducks at all.

On the other side of the stream stood an old oak tree, the biggest tree in the whole wood. High in its
branches, caught by its string, was the red kite, flapping gently like a flag. "It is too high for me," said
Pia sadly. But Button was already climbing. Up he went, one paw and then another, past a sleeping owl and a
busy squirrel, until he reached the branch. He pulled the string with his teeth until the kite came loose and
floated down, slowly, slowly, right into Pia's arms.

Getting down was harder than going up, as it often is for cats. Button sat on the branch and made a small,
unhappy sound. "Jump, Button, I will catch you," said Pia, and she held out her coat like a net. Button
thought about it for a long time. Then he jumped, and Pia caught him, and they both fell into a pile of
leaves and laughed, although Button would tell you that cats do not laugh.

They walked home as the sun was going down, the kite under Pia's arm and Button on her shoulder. The robin
sang them one last song. That night Pia hung the kite back on its hook and gave Button an extra bowl of milk.
"Thank you for being brave," she whispered. Button purred, curled up by the warm stove, and fell asleep,
dreaming of ducks, and kites, and very tall trees.
"""

VOCAB = 257  # 256 byte values + 1 (end of text)
SEQ = 64
BATCH = 8
SEEDS = (0, 1, 2, 3, 4)


def story_batch(batch: int = BATCH, seq: int = SEQ) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` evenly spaced windows of seq + 1 bytes of the story: inputs and next-byte targets."""
    data = torch.tensor(list(STORY.encode("utf-8")), dtype=torch.long)
    step = (len(data) - seq - 1) // batch
    rows = torch.stack([data[i * step: i * step + seq + 1] for i in range(batch)])
    return rows[:, :-1], rows[:, 1:]


def depth_model(variant: str, blocks: int, seed: int) -> Transformer:
    m = ModelConfig(size="tiny", variant=variant, d_model=64, n_layers=blocks, n_heads=4, d_ff=256, seq_len=SEQ,
                    vocab_size=VOCAB)
    return build_model(m, seed=seed)


def gradient_ratios(variant: str, blocks: int, seed: int) -> tuple[float, float]:
    """(a): ||dL/d theta_0|| / ||dL/d theta_{B-1}|| over block parameters, and the same for the state entering."""
    model = depth_model(variant, blocks, seed)
    entering: list[torch.Tensor] = []

    def keep(module, args):
        args[0].retain_grad()
        entering.append(args[0])

    for blk in model.blocks:
        blk.register_forward_pre_hook(keep)
    idx, tgt = story_batch()
    model(idx, tgt).backward()

    def block_norm(blk) -> float:
        return torch.sqrt(sum(p.grad.double().pow(2).sum() for p in blk.parameters())).item()

    param_ratio = block_norm(model.blocks[0]) / block_norm(model.blocks[-1])
    state_ratio = (entering[0].grad.norm() / entering[-1].grad.norm()).item()
    return param_ratio, state_ratio


def skip_path_jvp(variant: str, blocks: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(b): (v, J v) for J = dh_L/dh_0 with every output projection zeroed; h_0 the embedded story batch."""
    model = depth_model(variant, blocks, seed)
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.proj.weight.zero_()
            blk.mlp.proj.weight.zero_()
    idx, _ = story_batch(batch=2)
    h0 = (model.tok_emb(idx) + model.pos_emb.weight[:SEQ]).detach()

    def stack(h: torch.Tensor) -> torch.Tensor:
        for blk in model.blocks:
            h = blk(h)
        return h

    v = torch.randn(h0.shape, generator=torch.Generator().manual_seed(seed))
    # autograd's JVP is a double backward, which only the reference (math) attention kernel implements
    with sdpa_kernel(SDPBackend.MATH):
        _, jv = torch.autograd.functional.jvp(stack, h0, v)
    return v, jv


# ---------------------------------------------------------------------------------------------
# Tests at 40 sublayers


@pytest.fixture(scope="module")
def ratios40() -> dict[str, list[tuple[float, float]]]:
    return {v: [gradient_ratios(v, 20, s) for s in SEEDS] for v in ("review", "review_convex")}


def test_story_batch_is_bytes():
    idx, tgt = story_batch()
    assert idx.shape == tgt.shape == (BATCH, SEQ)
    assert int(idx.max()) < 256 and torch.equal(idx[:, 1:], tgt[:, :-1])
    assert len(STORY.encode()) > 2000


def test_gradient_ratio_additive_stays_near_one(ratios40):
    """Measured 0.99-1.09 over seeds 0-4 (0.99-1.09 over 0-9, docs/depth.md): undiminished at block 0."""
    for seed, (param_ratio, state_ratio) in zip(SEEDS, ratios40["review"]):
        assert 0.7 <= param_ratio <= 1.4, (seed, param_ratio)
        assert 0.7 <= state_ratio <= 1.4, (seed, state_ratio)


def test_gradient_ratio_convex_is_smaller_but_no_half_power_collapse(ratios40):
    """Measured 0.025-0.32 over seeds 0-4 (median 0.13): well below the additive form, far above 0.5^40."""
    convex = [r for r, _ in ratios40["review_convex"]]
    additive = [r for r, _ in ratios40["review"]]
    assert statistics.median(convex) < 0.35, convex
    assert max(convex) < 0.6, convex
    for c, a in zip(convex, additive):
        assert c < 0.6 * a  # same seed, same shared weights: the convex rule loses gradient on the way down
    assert min(convex) > 0.02, convex  # ... but nothing like 0.5^40 = 9e-13: RMSNorm re-scales each input
    assert all(s > 0.02 for _, s in ratios40["review_convex"])


def test_skip_path_weight_convex_is_half_to_the_40():
    v, jv = skip_path_jvp("review_convex", 20)
    w = 0.5 ** 40
    assert abs(w - 9.094947e-13) < 1e-18
    torch.testing.assert_close(jv, w * v, rtol=1e-5, atol=0)
    assert (jv.norm() / v.norm()).item() == pytest.approx(w, rel=1e-5)


def test_skip_path_weight_additive_is_one():
    for variant in ("review", "standard"):
        v, jv = skip_path_jvp(variant, 20)
        torch.testing.assert_close(jv, v, rtol=1e-6, atol=1e-7)


def test_skip_path_weight_convex_by_depth():
    """w = 0.5^(sublayers) at 12 and 24 sublayers too."""
    for blocks in (6, 12):
        v, jv = skip_path_jvp("review_convex", blocks)
        torch.testing.assert_close(jv, 0.5 ** (2 * blocks) * v, rtol=1e-5, atol=0)


# ---------------------------------------------------------------------------------------------
# The table in docs/depth.md: python tests/unit/rrtrain/model/test_depth.py [SEEDS]


def table(n_seeds: int = 10) -> str:
    rows = ["| sublayers | rule | (a) G, block parameters: min / median / max "
            "| (a') state entering: min / median / max | (b) skip-path weight ‖Jv‖/‖v‖ |",
            "|---|---|---|---|---|"]
    per_seed = ["| rule | " + " | ".join(f"seed {s}" for s in range(n_seeds)) + " |",
                "|---|" + "---|" * n_seeds]
    for blocks in (6, 12, 20):
        for variant in ("review", "review_convex"):
            r = [gradient_ratios(variant, blocks, s) for s in range(n_seeds)]
            p, s = sorted(x for x, _ in r), sorted(y for _, y in r)
            v, jv = skip_path_jvp(variant, blocks)
            w = (jv.norm() / v.norm()).item()
            rows.append(f"| {2 * blocks} | `{variant}` | {p[0]:.3f} / {statistics.median(p):.3f} / {p[-1]:.3f} | "
                        f"{s[0]:.3f} / {statistics.median(s):.3f} / {s[-1]:.3f} | {w:.4g} |")
            if blocks == 20:
                per_seed.append(f"| `{variant}` | " + " | ".join(f"{x:.3f}" for x, _ in r) + " |")
    return "\n".join(rows) + "\n\nG per seed at 40 sublayers:\n\n" + "\n".join(per_seed)


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, seeds 0..{int(sys.argv[1]) - 1 if len(sys.argv) > 1 else 9}")
    print(table(int(sys.argv[1]) if len(sys.argv) > 1 else 10))
