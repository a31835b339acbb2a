"""Greedy generation for lm-eval's `generate_until` requests, as lm-eval's HFLM has transformers' `generate` do it
on an exported model, so the texts agree with `lm_eval --model hf` (tests/e2e/test_eval.py compares them).

What HFLM does, and so what this does: the generation settings normalised by lm-eval (`max_gen_toks`, default 256;
`until`, its stop strings); the context left-truncated to the model's length less `max_gen_toks`; greedy decoding
(a task that samples or searches beams is refused before the evaluation: rrtrain.eval.tasks.check_generation) until
every row has produced the end-of-document token, one of its stop strings, or `max_gen_toks` tokens; each text
decoded without the end-of-document token and cut before its first stop string.

Two ways to run the model, each a batch at a time:
- `decode_cached`: the model's own inference path, the one the exported `RrtrainForCausalLM` calls
  (rrtrain/model/transformer.py, `Attend`): the batch padded on the left with an attention mask, one forward over
  the contexts, then one token per row per step against a key/value cache (`KeyValueCache`). `rrtrain eval` runs
  this on the model it loaded: each process its own, so no forward is a collective.
- `decode_plain`: the training model's plain forward (token ids -> logits) over the whole sequence at each step,
  padded on the right (causal attention never looks at what lies to the right of a row); with `fixed_shape` every
  forward is (batch_size, seq_len), so a compiled model sees no new shape. This is the in-loop evaluation's path,
  where a sharded model's forward is a collective: `more` decides each step, across ranks, whether any row anywhere
  is still being generated, and a rank with nothing left runs its forward all the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

#: (token ids (B, T), attention mask (B, cached + T), cache) -> logits (B, T, V)
Cached = Callable[[torch.Tensor, torch.Tensor, Any], torch.Tensor]
#: token ids (B, T) -> logits (B, T, V)
Forward = Callable[[torch.Tensor], torch.Tensor]
#: this rank's "a row is still being generated" -> whether any rank's is (identity on one process)
More = Callable[[bool], bool]


@dataclass(frozen=True)
class Job:
    """One `generate_until` request, tokenised: the (truncated) context, its stop strings and its length limit."""

    context: list[int]
    until: tuple[str, ...]
    max_new: int


class KeyValueCache:
    """Each attention's keys and values so far, (B, H, K, hd): the part of transformers' Cache API
    (`get_seq_length`, `update`) that the model package calls, without importing transformers."""

    def __init__(self) -> None:
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def get_seq_length(self, layer: int = 0) -> int:
        return int(self.layers[layer][0].shape[-2]) if layer in self.layers else 0

    def update(self, k: torch.Tensor, v: torch.Tensor, layer: int, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if layer in self.layers:
            old_k, old_v = self.layers[layer]
            k, v = torch.cat([old_k, k], dim=-2), torch.cat([old_v, v], dim=-2)
        self.layers[layer] = (k, v)
        return k, v


def cached_forward(model: torch.nn.Module) -> Cached:
    """A model of the model package (or its HF wrapper's inner model) called as `generate` calls it."""

    def call(ids: torch.Tensor, mask: torch.Tensor, cache: Any) -> torch.Tensor:
        return model(ids, attention_mask=mask, cache=cache)

    return call


class Rows:
    """The tokens generated for each row of a batch, and whether each row is still being generated."""

    def __init__(self, jobs: Sequence[Job], eos: int, decode: Callable[[list[int]], str]) -> None:
        self.jobs, self.eos, self.decode = list(jobs), eos, decode
        self.out: list[list[int]] = [[] for _ in self.jobs]
        self.live = [job.max_new > 0 for job in self.jobs]

    def any_live(self) -> bool:
        return any(self.live)

    def add(self, r: int, token: int) -> None:
        if not self.live[r]:
            return
        self.out[r].append(token)
        job = self.jobs[r]
        done = token == self.eos or len(self.out[r]) >= job.max_new
        self.live[r] = not (done or any(u and u in self.decode(self.out[r]) for u in job.until))

    def texts(self) -> list[str]:
        """Each row's text: decoded without the end-of-document token (and what follows it), cut before its first
        stop string (lm-eval's `postprocess_generated_text`)."""
        found = []
        for job, toks in zip(self.jobs, self.out):
            text = self.decode(toks[:toks.index(self.eos)] if self.eos in toks else toks)
            for term in job.until:
                if term:
                    text = text.split(term)[0]
            found.append(text)
        return found


def decode_cached(call: Cached, jobs: Sequence[Job], eos: int, decode: Callable[[list[int]], str],
                  device: torch.device) -> list[str]:
    """Greedy texts for `jobs` (one batch) through the model's cached inference path, padded on the left."""
    rows = Rows(jobs, eos, decode)
    if not rows.any_live():
        return rows.texts()
    width = max(len(job.context) for job in jobs)
    ids = torch.full((len(jobs), width), eos, dtype=torch.long)
    mask = torch.zeros((len(jobs), width), dtype=torch.long)
    for r, job in enumerate(jobs):
        ids[r, width - len(job.context):] = torch.tensor(job.context, dtype=torch.long)
        mask[r, width - len(job.context):] = 1
    ids, mask, cache = ids.to(device), mask.to(device), KeyValueCache()
    with torch.no_grad():
        logits = call(ids, mask, cache)
        while True:
            step = logits[:, -1].argmax(dim=-1)  # (B,)
            for r, token in enumerate(step.tolist()):
                rows.add(r, int(token))
            if not rows.any_live():
                return rows.texts()
            mask = torch.cat([mask, torch.ones((len(jobs), 1), dtype=mask.dtype, device=device)], dim=1)
            logits = call(step[:, None], mask, cache)


def decode_plain(forward: Forward, jobs: Sequence[Job], eos: int, decode: Callable[[list[int]], str],
                 device: torch.device, shape: Optional[tuple[int, int]] = None,
                 more: More = lambda live: live) -> list[str]:
    """Greedy texts for `jobs` (one batch, possibly none) through the plain forward over whole sequences, padded on
    the right; `shape`: every forward's (rows, length). Collective through `more` (and a sharded `forward`): call
    it on every rank as often."""
    rows = Rows(jobs, eos, decode)
    seqs = [list(job.context) for job in jobs]
    while more(rows.any_live()):
        height, width = shape or (max(len(jobs), 1), max((len(s) for s in seqs), default=1))
        ids = torch.full((height, width), eos, dtype=torch.long)
        for r, seq in enumerate(seqs):
            ids[r, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        with torch.no_grad():
            logits = forward(ids.to(device))  # (height, width, V)
        for r, seq in enumerate(seqs):
            if rows.live[r]:
                token = int(logits[r, len(seq) - 1].argmax())
                rows.add(r, token)
                seq.append(token)
    return rows.texts()
