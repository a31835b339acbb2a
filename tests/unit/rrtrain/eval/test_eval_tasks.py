"""Downstream evaluation's parts on their own (rrtrain/eval/): the model class scores as lm-eval's HFLM does
(left truncation, rolling windows, any batch size) and gives the same scores when its requests are split over
ranks, with as many forwards on each; lm-eval's results flattened to the result file's form; the result file's
name; the `eval.downstream` keys' checks; and the in-loop callback's steps, on a stand-in loop, across a resume.
A real run, `rrtrain eval` and `lm_eval --model hf`: tests/e2e/test_eval.py."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from rrtrain.config import ModelConfig, load_config
from rrtrain.core.errors import UsageError
from rrtrain.eval import harness
from rrtrain.eval.callback import DownstreamEval
from rrtrain.eval.lm import RRTrainLM, Share
from rrtrain.eval.tasks import parse_tasks, result_key
from rrtrain.resolve import build_model

SEQ = 16


class Bytes:
    """A stand-in for rrtrain's byte tokenizer: bytes, end of document 256."""

    eos_id = 256

    def encode_batch(self, texts):
        return [list(t.encode()) for t in texts]

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode(errors="replace")


@pytest.fixture(scope="module")
def model():
    m = build_model(ModelConfig(size="tiny", variant="review", d_model=32, n_layers=2, n_heads=2, seq_len=SEQ),
                    vocab_size=258)
    return m.eval()


def counting(model):
    calls = []

    def forward(idx):
        calls.append(tuple(idx.shape))
        with torch.no_grad():
            return model(idx)
    return forward, calls


def direct(model, ctx: list[int], cont: list[int]) -> float:
    """The continuation's log-likelihood from one unbatched forward, left-truncated to the model's context."""
    whole = (ctx + cont)[-(SEQ + 1):]
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([whole[:-1]])).float(), dim=-1)[0]
    return sum(logp[len(whole) - 1 - len(cont) + i, t].item() for i, t in enumerate(cont))


PAIRS = [([256, 72, 105], [33]), ([256] + list(b"Once upon a time, a very long context"), list(b" indeed")),
         ([256, 65], list(b"BCDEF")), ([256, 1, 2, 3], [4, 5]), ([256], list(b"x"))]


@pytest.mark.parametrize("batch_size", [1, 2, 16])
def test_scores_match_unbatched_forwards_with_left_truncation(model, batch_size):
    forward, calls = counting(model)
    lm = RRTrainLM(forward, Bytes(), SEQ, batch_size=batch_size)
    got = lm.score(PAIRS)
    for (ll, _), (ctx, cont) in zip(got, PAIRS):
        assert ll == pytest.approx(direct(model, ctx, cont), abs=1e-4)
    assert len(calls) == math.ceil(len(PAIRS) / batch_size)
    assert max(shape[1] for shape in calls) == SEQ  # the long context was cut to the model's seq_len


def test_rolling_loglikelihood_is_the_whole_text_after_the_end_of_document_token(model):
    text = "The cat sat on the mat and then it sat on the hat."  # longer than SEQ: several windows
    toks = list(text.encode())
    with torch.no_grad():  # each token conditioned on everything before it, within seq_len tokens
        full = [256] + toks
        expected = 0.0
        for i in range(1, len(full)):
            window = full[max(0, i - SEQ):i]
            logp = F.log_softmax(model(torch.tensor([window])).float(), dim=-1)[0, -1]
            expected += logp[full[i]].item()
    lm = RRTrainLM(counting(model)[0], Bytes(), SEQ, batch_size=3)
    (got,) = lm.loglikelihood_rolling([SimpleNamespace(args=(text,))])
    # lm-eval's disjoint windows give later windows less context than the sliding one above: close, not equal
    assert got == pytest.approx(expected, rel=0.05)
    short = "Hi there."
    (got_short,) = lm.loglikelihood_rolling([SimpleNamespace(args=(short,))])
    assert got_short == pytest.approx(direct(model, [256], list(short.encode())), abs=1e-4)


def test_requests_split_over_ranks_give_the_same_scores_with_equal_forward_counts(model):
    pairs = PAIRS * 2 + [([256, 9], [10])]  # 11 requests, batch 2: 6 batches over 4 ranks -> 2 forwards each
    alone = RRTrainLM(counting(model)[0], Bytes(), SEQ, batch_size=2).score(pairs)
    world, parts, counts = 4, {}, {}

    class Collected(Exception):
        pass

    def keep(rank):
        def gather(mine):
            parts[rank] = dict(mine)
            raise Collected  # the other ranks' scores are not known yet
        return gather

    for rank in range(world):  # each rank's own scores first
        forward, calls = counting(model)
        with pytest.raises(Collected):
            RRTrainLM(forward, Bytes(), SEQ, batch_size=2, share=Share(rank, world, keep(rank))).score(pairs)
        counts[rank] = len(calls)
    assert sorted(i for part in parts.values() for i in part) == list(range(len(pairs)))  # each scored once
    assert set(counts.values()) == {2}
    for rank in range(world):  # then the gather hands every rank all of them
        got = RRTrainLM(counting(model)[0], Bytes(), SEQ, batch_size=2,
                        share=Share(rank, world, lambda mine: [parts[r] for r in range(world)])).score(pairs)
        assert [round(ll, 5) for ll, _ in got] == [round(ll, 5) for ll, _ in alone]
        assert [g for _, g in got] == [g for _, g in alone]


def test_fixed_shape_pads_every_forward_to_batch_size_by_seq_len(model):
    forward, calls = counting(model)
    got = RRTrainLM(forward, Bytes(), SEQ, batch_size=4, fixed_shape=True).score(PAIRS)
    assert set(calls) == {(4, SEQ)}
    for (ll, _), (ctx, cont) in zip(got, PAIRS):
        assert ll == pytest.approx(direct(model, ctx, cont), abs=1e-4)


def test_lm_eval_results_are_flattened_without_the_default_filter():
    raw = {"mc": {"alias": "mc", "acc,none": 0.5, "acc_stderr,none": 0.1, "acc_norm,none": 0.25,
                  "acc_norm_stderr,none": "N/A", "sample_len": 8},
           "ppl": {"word_perplexity,none": float("inf"), "word_perplexity_stderr,none": "N/A",
                   "exact_match,strict-match": 1.0, "exact_match_stderr,strict-match": 0.0}}
    flat = harness.flatten(raw)
    assert flat == {"mc": {"acc": 0.5, "acc_stderr": 0.1, "acc_norm": 0.25, "acc_norm_stderr": None},
                    "ppl": {"word_perplexity": None, "word_perplexity_stderr": None,
                            "exact_match.strict-match": 1.0, "exact_match.strict-match_stderr": 0.0}}
    assert harness.records(flat) == {"downstream/mc/acc": 0.5, "downstream/mc/acc_norm": 0.25,
                                     "downstream/ppl/exact_match.strict-match": 1.0,
                                     "downstream/ppl/word_perplexity": None}


def test_result_key_sorts_tasks_and_names_fewshot_and_limit():
    assert result_key(["piqa", "arc_easy"], None, None) == "arc_easy+piqa"
    assert result_key(["arc_easy"], 5, 100) == "arc_easy-fewshot5-limit100"
    assert result_key(["a"], 0, None) == "a-fewshot0"
    long = [f"task_number_{i:03d}" for i in range(12)]
    key = result_key(long, None, 3)
    assert len(key) == 12 and all(c in "0123456789abcdef" for c in key)
    assert parse_tasks("b, a,b") == ["a", "b"]
    for bad in ("", "a,,", "a/b", "../x"):
        with pytest.raises(UsageError, match="--tasks"):
            parse_tasks(bad)


@pytest.mark.parametrize("overrides,message", [
    (["eval.downstream.tasks=[a]", "train.ckpt_every=4", "eval.downstream.every=6"], "multiple of train.ckpt_every"),
    (["eval.downstream.tasks=[a]", "eval.downstream.every=4"], "multiple of train.ckpt_every=0"),
    (["eval.downstream.tasks=[a/b]"], "not a task name"),
    (["eval.downstream.tasks=[a,a]"], "listed twice"),
    (["eval.downstream.limit=0"], "limit must be at least 1"),
    (["eval.downstream.batch_size=0"], "batch_size must be positive"),
    (["eval.downstream.num_fewshot=-1"], "num_fewshot must not be negative"),
    (["eval.downstream.taks=[a]"], "did you mean 'eval.downstream.tasks'"),
])
def test_bad_downstream_settings_are_one_line(overrides, message):
    with pytest.raises(UsageError, match=message):
        load_config(None, overrides)


def test_downstream_settings_that_fit():
    cfg = load_config(None, ["eval.downstream.tasks=[b,a]", "train.ckpt_every=4", "eval.downstream.every=8"])
    assert cfg.eval.downstream.tasks == ["b", "a"] and cfg.eval.downstream.every == 8
    assert load_config(None, []).eval.downstream.tasks == []  # off by default


class FakeLoop:
    def __init__(self, total: int, step: int = 0, resumed_at=None) -> None:
        self.step, self.total_steps, self.resumed_at = step, total, resumed_at


def run_steps(cb: DownstreamEval, loop: FakeLoop, upto: int, end: bool) -> None:
    while loop.step < upto:
        loop.step += 1
        cb.on_step_end(loop)
    if end:
        cb.on_eval(loop, {"step": loop.step, "val_loss": 1.0})


@pytest.fixture
def callback(monkeypatch, tmp_path):
    (tmp_path / "t.yaml").write_text("task: t\ndataset_path: json\noutput_type: multiple_choice\n")
    monkeypatch.setattr(DownstreamEval, "evaluate", lambda self, loop: (self.done.append(loop.step),
                                                                        setattr(self, "last", loop.step)))

    def make(every, ckpt_every):
        cfg = load_config(None, ["eval.downstream.tasks=[t]", f"eval.downstream.include={tmp_path}",
                                 f"train.ckpt_every={ckpt_every}"] +
                          ([f"eval.downstream.every={every}"] if every is not None else []))
        cb = DownstreamEval(cfg.eval.downstream, ckpt_every)
        cb.done = []
        return cb
    return make


def test_evaluations_fall_on_checkpoint_steps_and_the_last_step(callback):
    cb = callback(None, 4)
    run_steps(cb, FakeLoop(10), 10, end=True)
    assert cb.done == [4, 8, 10]
    cb = callback(8, 4)
    run_steps(cb, FakeLoop(16), 16, end=True)
    assert cb.done == [8, 16]  # the last step once, although 16 is a multiple of every
    cb = callback(0, 4)
    run_steps(cb, FakeLoop(12), 12, end=True)
    assert cb.done == [12]


def test_a_resumed_run_neither_repeats_nor_skips_an_evaluation(callback):
    first = callback(None, 4)
    run_steps(first, FakeLoop(12), 8, end=False)  # stopped after step 8's evaluation and checkpoint
    saved = first.state_dict()
    second = callback(None, 4)
    second.load_state_dict(saved)
    run_steps(second, FakeLoop(12, step=8, resumed_at=8), 12, end=True)
    assert first.done + second.done == [4, 8, 12]
    # stopped at the last step before its evaluation (preempted there): the resumed run evaluates it once
    third = callback(None, 4)
    third.load_state_dict({"last": 8})
    loop = FakeLoop(12, step=12, resumed_at=12)
    third.on_eval(loop, {"step": 12})
    assert third.done == [12]
    # resumed at the last step after its evaluation: nothing again
    fourth = callback(None, 4)
    fourth.load_state_dict({"last": 12})
    fourth.on_eval(loop, {"step": 12})
    assert fourth.done == []


def test_a_missing_include_is_refused_before_the_run_starts(tmp_path):
    (tmp_path / "t.yaml").write_text("task: t\ndataset_path: json\noutput_type: multiple_choice\n")
    cfg = load_config(None, ["eval.downstream.tasks=[t]", f"eval.downstream.include={tmp_path / 'nope'}"])
    with pytest.raises(UsageError, match="eval.downstream.include"):
        DownstreamEval(cfg.eval.downstream, 0)


def test_a_run_with_wandb_sends_the_downstream_records_there_as_tensorboard_gets_them(tmp_path):
    from rrtrain.core.signals import StopFlag
    from rrtrain.monitoring.wandb_logger import WandbLogger
    from rrtrain.train import default_callbacks

    (tmp_path / "t.yaml").write_text("task: t\ndataset_path: json\noutput_type: multiple_choice\n")
    cfg = load_config(None, ["eval.downstream.tasks=[t]", f"eval.downstream.include={tmp_path}", "log.wandb={}"])
    callbacks = default_callbacks(cfg, StopFlag())
    (down,) = [c for c in callbacks if isinstance(c, DownstreamEval)]
    (wandb,) = [c for c in callbacks if isinstance(c, WandbLogger)]
    assert down.priority > max(c.priority for c in callbacks if c.name == "checkpoint")  # evaluated, then saved
    sent = []
    wandb.run = SimpleNamespace(log=lambda values, step: sent.append((step, values)))
    (mirror,) = down.mirrors
    mirror(8, {"kind": "downstream", "step": 8, "seconds": 1.5, "downstream/t/acc": 0.5}, "eval")
    assert sent == [(8, {"eval/seconds": 1.5, "eval/downstream/t/acc": 0.5})]
