"""Document masking (`model.doc_mask`, rrtrain/model/transformer.py `document_attend`): in a packed row each
document attends to itself alone, so its logits are the ones it gets alone; without the mask they are not.
Every residual rule runs with it; settings that mean nothing or cannot work are refused in one line."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rrtrain import residuals
from rrtrain.config import Config, ModelConfig
from rrtrain.core.errors import UsageError
from rrtrain.model.spec import ModelSpec
from rrtrain.model.transformer import Transformer, document_attend
from rrtrain.resolve import build_model, check_model, model_spec, resolve

EOD, VOCAB, SEQ = 0, 50, 48


def model_config(**kw) -> ModelConfig:
    base = dict(size="tiny", d_model=32, n_layers=2, n_heads=2, d_ff=64, seq_len=SEQ, vocab_size=VOCAB)
    return ModelConfig(**{**base, **kw})


def documents(lengths: tuple[int, ...], seed: int = 1) -> list[torch.Tensor]:
    """Documents of these lengths (their end-of-document token included), no other EOD inside."""
    g = torch.Generator().manual_seed(seed)
    return [torch.cat([torch.randint(1, VOCAB, (n - 1,), generator=g), torch.tensor([EOD])]) for n in lengths]


def per_document_gap(model: Transformer, docs: list[torch.Tensor]) -> list[float]:
    """For each document: the largest difference between its logits in the packed row and alone."""
    with torch.no_grad():
        packed = model(torch.cat(docs)[None])[0]
        gaps, at = [], 0
        for doc in docs:
            alone = model(doc[None])[0]
            gaps.append((packed[at:at + len(doc)] - alone).abs().max().item())
            at += len(doc)
    return gaps


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_each_documents_logits_in_a_packed_row_are_its_logits_alone(pos):
    docs = documents((11, 17, 9, 11))  # 48 tokens: one full row
    masked = Transformer(model_spec(model_config(pos=pos, doc_mask=True, eod_id=EOD)), seed=0).eval()
    plain = Transformer(dataclasses.replace(masked.spec, doc_mask=False), seed=0).eval()
    assert max(per_document_gap(masked, docs)) < 1e-5
    gaps = per_document_gap(plain, docs)
    assert gaps[0] < 1e-5 and min(gaps[1:]) > 1e-3  # the first has nothing before it; the others see across


def test_rope_positions_may_continue_over_the_row():
    """RoPE scores depend on the distance within a document alone: `continue` gives the same logits."""
    docs = documents((20, 28), seed=2)
    model = Transformer(model_spec(model_config(pos="rope", doc_mask=True, eod_id=EOD, doc_positions="continue")),
                        seed=0).eval()
    assert max(per_document_gap(model, docs)) < 1e-4
    learned = Transformer(model_spec(model_config(doc_mask=True, eod_id=EOD, doc_positions="continue")), seed=0)
    assert per_document_gap(learned.eval(), docs)[1] > 1e-3  # learned positions: the second document sits later


def test_the_mask_and_positions_follow_the_end_of_document_tokens():
    idx = torch.tensor([[5, 6, EOD, 7, EOD, 8, 9, 9]])
    attend = document_attend(idx, EOD, restart=True)
    assert attend.positions.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    mask = attend.mask[0, 0].int()
    assert mask[2].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]  # the EOD belongs to the document it ends
    assert mask[3].tolist() == [0, 0, 0, 1, 0, 0, 0, 0]  # the next document starts after it
    assert mask[7].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    assert document_attend(idx, EOD, restart=False).positions.tolist() == [list(range(8))]


def test_a_row_without_boundaries_is_plain_causal_attention():
    spec = model_spec(model_config(pos="rope", doc_mask=True, eod_id=EOD))
    masked, plain = Transformer(spec, seed=0).eval(), Transformer(dataclasses.replace(spec, doc_mask=False), seed=0)
    idx = torch.randint(1, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.allclose(masked(idx), plain.eval()(idx), atol=1e-5)


@pytest.mark.parametrize("rule", residuals.names())
def test_every_rule_builds_and_runs_with_the_mask(rule):
    torch.manual_seed(0)
    model = build_model(model_config(variant=rule, doc_mask=True, eod_id=EOD), seed=0)
    row = torch.cat(documents((15, 20, 14)))[None]
    loss = model(row[:, :-1], row[:, 1:])
    loss.backward()
    assert torch.isfinite(loss)
    assert max(per_document_gap(model.eval(), documents((15, 20, 13)))) < 1e-4


def test_the_spec_round_trips_and_an_unmasked_spec_is_as_it_was():
    masked = model_spec(model_config(doc_mask=True, eod_id=7, doc_positions="continue"))
    again = ModelSpec.from_dict(masked.to_dict(), [masked.rule])
    assert (again.doc_mask, again.doc_positions, again.eod_id) == (True, "continue", 7)
    plain = model_spec(model_config())
    assert not {"doc_mask", "doc_positions", "eod_id"} & set(plain.to_dict())  # exports of other models unchanged
    assert ModelSpec.from_dict(plain.to_dict(), [plain.rule]) == plain


def manifest(eos_id: int = EOD) -> dict:
    return {"vocab_size": VOCAB, "eos_id": eos_id, "seq_len": SEQ}


def test_a_run_takes_the_end_of_document_token_from_its_dataset():
    cfg = Config(model=model_config(vocab_size=None, seq_len=None, doc_mask=True))
    run = resolve(cfg, manifest(eos_id=3))
    assert run.cfg.model.eod_id == 3 and run.model_spec.eod_id == 3 and run.model_spec.doc_mask
    assert resolve(Config(model=model_config(vocab_size=None, seq_len=None)), manifest()).cfg.model.eod_id is None


@pytest.mark.parametrize("keys,manifest_eos,message", [
    (dict(doc_positions="continue"), None, "model.doc_positions=continue only apply with model.doc_mask=true"),
    (dict(eod_id=3), None, "model.eod_id=3 only apply with model.doc_mask=true"),
    (dict(doc_mask=True, eod_id=-1), None, "model.eod_id must be a token id"),
    (dict(doc_mask=True, eod_id=4), 3, "model.eod_id=4 but the dataset ends its documents with token 3"),
    (dict(doc_mask=True, eod_id=VOCAB), None, f"not a token of the model's vocabulary of {VOCAB}"),
])
def test_bad_combinations_are_one_line(keys, manifest_eos, message):
    cfg = Config(model=model_config(**keys))
    with pytest.raises(UsageError) as err:
        check_model(cfg)
        resolve(cfg, manifest(manifest_eos) if manifest_eos is not None else None)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_mask_without_its_token_is_refused_in_one_line():
    with pytest.raises(UsageError, match="model.doc_mask needs the end-of-document token id"):
        build_model(model_config(doc_mask=True))
    with pytest.raises(ValueError, match="doc_positions must be one of restart, continue"):
        Transformer(dataclasses.replace(model_spec(model_config()), doc_positions="sideways"))
