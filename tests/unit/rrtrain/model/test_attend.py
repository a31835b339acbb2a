"""The model outside training (rrtrain/model/transformer.py, `Attend`): a padding mask, positions counted from
each row's first real token, a key/value cache, and the length check, for every registered rule and both
position schemes; training's call stays plain causal attention. The exported model (rrtrain/export/) runs this
code as it is; tests/unit/rrtrain/export/test_export_hf.py drives it through transformers' `generate`.
"""

from __future__ import annotations

import pytest
import torch

import rrtrain.model.transformer as transformer
from rrtrain import residuals
from rrtrain.config import ModelConfig
from rrtrain.resolve import build_model

V, T = 64, 16
POSITIONS = ["learned", "rope"]


def perturbed(variant: str, pos: str) -> transformer.Transformer:
    """A tiny model of `variant` with every parameter moved off its initial value (gates, ReZero's zeros)."""
    m = ModelConfig(variant=variant, d_model=32, n_layers=2, n_heads=4, d_ff=64, seq_len=T, vocab_size=V, pos=pos)
    model = build_model(m, seed=0).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


class ListCache:
    """The two methods of transformers' Cache API the model uses, and nothing else of transformers."""

    def __init__(self) -> None:
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def get_seq_length(self) -> int:
        return self.layers[0][0].shape[-2] if self.layers else 0

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        if layer in self.layers:
            k, v = (torch.cat([old, new], dim=-2) for old, new in zip(self.layers[layer], (k, v)))
        self.layers[layer] = (k, v)
        return k, v


IDS = torch.randint(0, V, (3, 12), generator=torch.Generator().manual_seed(2))
LENGTHS = [12, 5, 9]  # real tokens of each row


@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("name", residuals.names())
def test_padded_rows_give_their_unpadded_logits(name: str, pos: str) -> None:
    """Left and right padding: no real token attends to padding and positions start at the first real token,
    so every real token's logits are those of its row alone (no rule mixes positions outside attention)."""
    model = perturbed(name, pos)
    with torch.no_grad():
        alone = [model(IDS[i:i + 1, :n])[0] for i, n in enumerate(LENGTHS)]
        for side in ("left", "right"):
            ids, mask = torch.zeros_like(IDS), torch.zeros_like(IDS)
            for i, n in enumerate(LENGTHS):
                cols = slice(12 - n, 12) if side == "left" else slice(0, n)
                ids[i, cols], mask[i, cols] = IDS[i, :n], 1
            logits = model(ids, attention_mask=mask)
            assert torch.isfinite(logits).all()
            for i, want in enumerate(alone):
                torch.testing.assert_close(logits[i][mask[i].bool()], want, rtol=0, atol=1e-5, msg=f"{side} row {i}")


@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("name", residuals.names())
def test_cached_decoding_gives_the_whole_sequences_logits(name: str, pos: str) -> None:
    """A prefill, then a chunk of two, then one token at a time against the cache, with a left-padded row:
    each step's logits are those of the whole sequence. Attention keys and values are all a rule needs cached."""
    model = perturbed(name, pos)
    mask = torch.ones_like(IDS)
    mask[1, :7] = 0
    with torch.no_grad():
        whole = model(IDS, attention_mask=mask)
        cache, got, start = ListCache(), [], 0
        for stop in (6, 8, 9, 10, 11, 12):
            got.append(model(IDS[:, start:stop], attention_mask=mask[:, :stop], cache=cache))
            start = stop
    assert cache.get_seq_length() == 12
    torch.testing.assert_close(torch.cat(got, dim=1), whole, rtol=0, atol=1e-5)


def test_explicit_positions_and_their_range() -> None:
    model = perturbed("review", "rope")
    with torch.no_grad():
        shifted = model(IDS[:1, :4], position_ids=torch.arange(3, 7)[None])
        after = model(IDS[:1, :7])[:, 3:]
    assert not torch.allclose(shifted, after, atol=1e-3)  # positions matter, tokens 0..2 are missing
    with pytest.raises(ValueError, match=r"position_ids must lie in \[0, 16\)"):
        model(IDS[:1, :4], position_ids=torch.arange(13, 17)[None])
    with pytest.raises(ValueError, match=r"attention_mask must be \(batch, cached \+ new tokens\) = \(1, 4\)"):
        model(IDS[:1, :4], attention_mask=torch.ones(1, 5))


@pytest.mark.parametrize("pos", POSITIONS)
def test_a_sequence_past_the_length_is_a_clear_error(pos: str) -> None:
    model = perturbed("standard", pos)
    ids = torch.randint(0, V, (1, T + 1))
    assert model(ids[:, :T]).shape == (1, T, V)
    with pytest.raises(ValueError, match=f"a sequence of {T + 1} tokens is longer than the model's maximum "
                                         f"length of {T} tokens"):
        model(ids)
    cache = ListCache()
    model(ids[:, :T], cache=cache)
    with pytest.raises(ValueError, match=f"a sequence of {T + 1} tokens"):
        model(ids[:, T:], cache=cache)


def test_training_runs_plain_causal_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a mask, positions or cache: the fused causal kernel, no mask tensor (training's speed)."""
    calls = []
    real = transformer.F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        calls.append(kwargs)
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(transformer.F, "scaled_dot_product_attention", spy)
    model = perturbed("review", "rope")
    model(IDS, IDS).backward()
    assert calls == [{"is_causal": True, "scale": None}] * 2  # SDPA's own 1/sqrt(d_head) (sp)
    calls.clear()
    model(IDS, attention_mask=torch.ones_like(IDS))  # nothing padded: still the fused causal kernel
    assert [c["is_causal"] for c in calls] == [True, True] and all(c["attn_mask"] is None for c in calls)
