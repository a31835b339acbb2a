"""Generation tasks (`generate_until`, rrtrain/eval/generate.py) in-process, against rrtrain's own model decoded
greedily one token at a time by a full forward (no cache, no padding): the batched paths (the key/value cache of
`rrtrain eval`, left-padded; the plain forward of the in-loop evaluation, right-padded, at a fixed shape or not)
give its texts, stop strings and the end-of-document token included; a local lm-eval task whose targets are those
texts scores an exact match of 1 through lm-eval's own request building and metric (the harness path); two ranks
(threads, a real gather) split the requests and run as many forwards each; sampling and a limit that leaves no room
for a context are one line. The same tasks against `lm_eval --model hf` on an export: tests/e2e/test_eval.py.
Runtime: about 2 s (a model of 2 blocks, width 32)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rrtrain.config import ModelConfig
from rrtrain.core.errors import UsageError
from rrtrain.eval import harness
from rrtrain.eval.generate import cached_forward
from rrtrain.eval.lm import RRTrainLM, Share
from rrtrain.eval.tasks import check_generation, generation_problem, load_tasks, task_manager
from rrtrain.resolve import build_model
from unit.rrtrain.eval.test_eval_tasks import Bytes

SEQ, NEW, EOS = 32, 6, 256
PROMPTS = ["Once upon a time", "A", "The little dog ran to the park and saw a big red ball there.", "Tom and"]


@pytest.fixture(scope="module")
def model():
    m = build_model(ModelConfig(size="tiny", variant="review", d_model=32, n_layers=2, n_heads=2, seq_len=SEQ),
                    vocab_size=258, seed=0)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))  # away from the initial values: varied greedy tokens
    return m.eval()


def greedy(model, prompt: str, until: list[str]) -> str:
    """The reference: one unpadded, uncached forward per token over the context (left-truncated to leave room for
    NEW tokens), stopped at the end-of-document token or NEW tokens, cut before the first stop string."""
    seq = list(prompt.encode())[-(SEQ - NEW):]
    out: list[int] = []
    with torch.no_grad():
        while len(out) < NEW:
            token = int(model(torch.tensor([seq]))[0, -1].argmax())
            if token == EOS:
                break
            out.append(token)
            seq.append(token)
    text = Bytes().decode(out)
    for term in until:
        text = text.split(term)[0]
    return text


def requests(until: list[str]) -> list[SimpleNamespace]:
    return [SimpleNamespace(args=(p, {"until": until, "max_gen_toks": NEW, "do_sample": False})) for p in PROMPTS]


def counting(model, calls: list):
    def forward(idx):
        calls.append(tuple(idx.shape))
        return model(idx)
    return forward


@pytest.mark.parametrize("path", ["cached-1", "cached-3", "plain", "plain-fixed"])
def test_every_path_gives_the_unbatched_greedy_texts(model, path):
    plain = greedy(model, PROMPTS[0], [])
    assert len({greedy(model, p, []) for p in PROMPTS}) == len(PROMPTS) and len(plain) >= 3  # varied, not empty
    until = [plain[2]]  # a stop string that the first prompt's text holds
    want = [greedy(model, p, until) for p in PROMPTS]
    calls: list = []
    batch = 1 if path == "cached-1" else 3
    lm = RRTrainLM(counting(model, calls), Bytes(), SEQ, batch_size=batch, fixed_shape=path == "plain-fixed",
                   cached=cached_forward(model) if path.startswith("cached") else None)
    assert lm.generate_until(requests(until)) == want
    if path == "plain-fixed":
        assert set(calls) == {(batch, SEQ)}


class ThreadGather:
    """`dist.gather_objects` between threads standing in for ranks: every rank's value, in rank order."""

    def __init__(self, world: int) -> None:
        self.barrier, self.slots = threading.Barrier(world), [None] * world

    def of(self, rank: int):
        def gather(value):
            self.slots[rank] = value
            self.barrier.wait()
            found = list(self.slots)
            self.barrier.wait()
            return found
        return gather


def test_two_ranks_split_the_requests_and_run_as_many_forwards(model):
    until = ["."]
    want = RRTrainLM(counting(model, []), Bytes(), SEQ, batch_size=1, fixed_shape=True).generate_until(requests(until))
    world, gather, got, calls = 2, ThreadGather(2), {}, {0: [], 1: []}

    def rank(r: int) -> None:
        lm = RRTrainLM(counting(model, calls[r]), Bytes(), SEQ, batch_size=1, fixed_shape=True,
                       share=Share(r, world, gather.of(r)))
        got[r] = lm.generate_until(requests(until))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got[0] == got[1] == want
    assert len(calls[0]) == len(calls[1]) > 0  # a sharded forward is a collective: lockstep


def write_task(root: Path, docs: list[dict], **gen) -> Path:
    root.mkdir()
    (root / "gen.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    kwargs = json.dumps({"until": ["."], "max_gen_toks": NEW, "do_sample": False, **gen})
    (root / "tiny_greedy.yaml").write_text(
        f"task: tiny_greedy\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'gen.jsonl'}\n"
        "test_split: test\noutput_type: generate_until\ndoc_to_text: prompt\ndoc_to_target: target\n"
        f"generation_kwargs: {kwargs}\nmetric_list:\n  - metric: exact_match\n")
    return root


def test_a_local_generation_task_matches_rrtrains_greedy_texts_through_the_harness(model, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    docs = [{"prompt": p, "target": greedy(model, p, ["."])} for p in PROMPTS]
    assert len({d["target"] for d in docs}) == len(docs)
    include = write_task(tmp_path / "tasks", docs)
    loaded = load_tasks(task_manager(["tiny_greedy"], include), ["tiny_greedy"], None)
    check_generation(loaded, SEQ)
    for cached in (cached_forward(model), None):
        lm = RRTrainLM(counting(model, []), Bytes(), SEQ, batch_size=3, fixed_shape=cached is None, cached=cached)
        assert harness.run(lm, loaded, None)["tiny_greedy"]["exact_match"] == 1.0


@pytest.mark.parametrize("gen,message", [
    ({"do_sample": True, "temperature": 0.7}, "it samples"),
    ({"temperature": 0.5}, "it samples"),
    ({"num_beams": 4}, "searches 4 beams"),
    ({"max_gen_toks": SEQ}, f"generates up to {SEQ} tokens, leaving no room for a context"),
])
def test_what_rrtrain_cannot_decode_is_one_line(model, gen, message):
    assert message in generation_problem({"until": ["."], **gen}, SEQ)
    lm = RRTrainLM(counting(model, []), Bytes(), SEQ, cached=cached_forward(model))
    with pytest.raises(UsageError, match=message) as refused:
        lm.generate_until([SimpleNamespace(args=("Hi", {"until": ["."], **gen}))])
    assert "\n" not in str(refused.value)
    assert generation_problem({"until": ["."], "max_gen_toks": SEQ - 1}, SEQ) is None
    assert generation_problem(None, 257) is None and "256 tokens" in generation_problem(None, SEQ)  # HFLM's default
