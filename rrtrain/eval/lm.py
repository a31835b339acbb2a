"""rrtrain's own model as an lm-evaluation-harness `LM`, registered as `rrtrain`.

The model is reached through one function, token ids (B, T) -> logits (B, T, V), so the same class scores a
model loaded from a checkpoint (`rrtrain eval`) and the model a run is training (`eval.downstream`), whatever
its residual rule or parallel backend. Requests are scored as lm-eval's HFLM scores them, so the numbers
agree with `lm_eval --model hf` on an exported model: the end-of-document token stands in front of an empty
context and of each rolling window; a context and continuation longer than the model's `seq_len` lose tokens
on the left; requests are sorted longest first and padded on the right into batches, one forward per batch.

Generation requests (`generate_until`) are decoded greedily as HFLM has transformers' `generate` decode them on an
exported model (rrtrain.eval.generate): through the model's cached inference path when the class is given one
(`cached`: `rrtrain eval`, the path the exported model's class calls), else through `forward` at each step (the
in-loop evaluation). Requests with the same generation settings are batched, longest context first.

In a run of several ranks each rank scores (or generates) every `world_size`-th batch and the results are gathered
to every rank (`Share`); every rank runs the same number of forwards (a short share is padded with a one-row
batch, a finished generation keeps stepping while another rank's goes on), since a sharded model's forward is a
collective. lm-eval itself sees one process (rank 0 of 1): every rank builds the same requests and computes the
same metrics from the gathered results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from rrtrain.core.errors import UsageError
from rrtrain.eval.generate import Cached, Job, cached_forward, decode_cached, decode_plain
from rrtrain.eval.tasks import MAX_GEN_TOKS, generation_problem

#: token ids (B, T) int64 on the model's device -> logits (B, T, V)
Forward = Callable[[torch.Tensor], torch.Tensor]
#: (context tokens, continuation tokens)
Pair = tuple[list[int], list[int]]


def _gather_here(value: object) -> list:
    return [value]


@dataclass(frozen=True)
class Share:
    """This process's part of an evaluation spread over ranks: `gather` is a collective returning every rank's
    object in rank order (rrtrain.core.dist.gather_objects); one process by default."""

    rank: int = 0
    world_size: int = 1
    gather: Callable[[object], list] = field(default=_gather_here)


@register_model("rrtrain")
class RRTrainLM(TemplateLM):
    """Log-likelihood requests (`loglikelihood`, `loglikelihood_rolling`, hence multiple-choice and perplexity
    tasks) over `forward`, and greedy generation (`generate_until`) over `cached` or `forward`."""

    def __init__(self, forward: Forward, tokenizer: Any, seq_len: int, *, device: torch.device | str = "cpu",
                 batch_size: int = 16, share: Share = Share(), fixed_shape: bool = False,
                 cached: Optional[Cached] = None, max_gen_toks: int = MAX_GEN_TOKS) -> None:
        """`tokenizer`: rrtrain's (data_prep.tokenizer: `encode_batch`, `decode`, `eos_id`). `fixed_shape`: every
        forward gets (batch_size, seq_len) tokens, so a compiled model never sees a new shape (in training).
        `cached`: the model's cached inference path for generation (rrtrain.eval.generate.cached_forward), used
        when this process holds the whole model; `max_gen_toks`: a generation task's default limit (HFLM's)."""
        super().__init__()
        if batch_size < 1:
            raise UsageError(f"batch size must be at least 1, got {batch_size}")
        self.forward, self.rr_tokenizer, self.seq_len = forward, tokenizer, int(seq_len)
        self._device, self.batch_size = torch.device(device), batch_size
        self.share, self.fixed_shape = share, fixed_shape
        self.cached, self.max_gen_toks = cached, int(max_gen_toks)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None
                            ) -> "RRTrainLM":
        """lm-eval's way in (`simple_evaluate(model="rrtrain", model_args={"run_dir": RUN, "step": N})`, after
        `import rrtrain.eval.lm`): a run's checkpoint (rrtrain.artifact; default: the newest), on
        `device` (default: CUDA when there is one), `batch_size` sequences per forward (default 16)."""
        from rrtrain.artifact import load_run

        args = {**arg_dict, **{k: v for k, v in (additional_config or {}).items() if v is not None}}
        if "run_dir" not in args:
            raise UsageError("model_args for rrtrain: run_dir=RUN_DIR is required (and optionally step=N)")
        device = torch.device(str(args.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")))
        step = args.get("step")
        run = load_run(str(args["run_dir"]), None if step in (None, "") else int(step), device=device)
        size = args.get("batch_size")
        batch = int(size) if isinstance(size, int) or (isinstance(size, str) and size.isdigit()) else 16
        return cls(run.model, run.tokenizer, run.model.shape.seq_len, device=device, batch_size=batch,
                   cached=cached_forward(run.model))

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict[str, Any] | None = None
                               ) -> "RRTrainLM":
        return cls.create_from_arg_obj(lm_utils.simple_parse_args_string(arg_string), additional_config)

    # -- what lm-eval asks of a model ----------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return int(self.rr_tokenizer.eos_id)

    @property
    def max_length(self) -> int:
        return self.seq_len

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """rrtrain's tokenizers add no special token: the end-of-document token only separates documents."""
        return [int(t) for t in self.rr_tokenizer.encode_batch([string])[0]]

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.rr_tokenizer.decode(tokens)

    def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str], list[int], list[int]]],
                              disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        return self.score([(ctx, cont) for _, ctx, cont in requests])

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Each text's whole log-likelihood in disjoint windows of `seq_len` predictions (lm-eval's own windows);
        every window of every text is scored in one batched pass."""
        pairs: list[Pair] = []
        counts: list[int] = []
        for (text,) in [req.args for req in requests]:
            windows = [lm_utils.make_disjoint_window(w) for w in lm_utils.get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                context_len=1)]
            pairs.extend(windows)
            counts.append(len(windows))
        scores = self.score(pairs)
        out, at = [], 0
        for n in counts:
            out.append(sum(ll for ll, _ in scores[at:at + n]))
            at += n
        return out

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Each request's greedy continuation (rrtrain.eval.generate), in order. Collective when `share` spans
        several ranks: every rank passes the same requests."""
        args = [req.args for req in requests]
        jobs = [self.job(context, kwargs) for context, kwargs in args]
        groups: dict[tuple[tuple[str, ...], int], list[int]] = {}
        for i in sorted(range(len(jobs)), key=lambda i: (-len(jobs[i].context), str(args[i][0]), i)):  # as HFLM
            groups.setdefault((jobs[i].until, jobs[i].max_new), []).append(i)
        batches = [ids[i:i + self.batch_size] for ids in groups.values() for i in range(0, len(ids), self.batch_size)]
        world, rank = self.share.world_size, self.share.rank
        mine = batches[rank::world]
        mine += [[]] * (math.ceil(len(batches) / world) - len(mine))  # equal batch counts on every rank
        done: dict[int, str] = {}
        for batch in mine:
            done.update(zip(batch, self._generate([jobs[i] for i in batch])))
        if world > 1:
            for part in self.share.gather(done):
                done.update(part)
        return [done[i] for i in range(len(jobs))]

    def job(self, context: str, gen_kwargs: Any) -> Job:
        """A request's context tokens and settings, as HFLM reads them (lm-eval's `normalize_gen_kwargs`; the
        context left-truncated to leave `max_gen_toks` of the model's length; an empty one is the end-of-document
        token, as for log-likelihoods)."""
        from lm_eval.models.utils import normalize_gen_kwargs

        problem = generation_problem(gen_kwargs, self.max_length, self.max_gen_toks)
        if problem:
            raise UsageError(f"a generation request: {problem}")
        kwargs = normalize_gen_kwargs(dict(gen_kwargs or {}), self.max_gen_toks)
        until, max_new = kwargs.get("until") or [], int(kwargs["max_gen_toks"])
        context = self.tok_encode(context)[-(self.max_length - max_new):] or [self.eot_token_id]
        return Job(context, tuple(str(u) for u in until), max_new)

    def _generate(self, jobs: list[Job]) -> list[str]:
        if self.cached is not None:  # this process's own model: no collective, no lockstep
            if not jobs:
                return []
            return decode_cached(self.cached, jobs, self.eot_token_id, self.tok_decode, self._device)
        gather = self.share.gather if self.share.world_size > 1 else None
        return decode_plain(self.forward, jobs, self.eot_token_id, self.tok_decode, self._device,
                            shape=(self.batch_size, self.max_length) if self.fixed_shape else None,
                            more=(lambda live: any(gather(live))) if gather else (lambda live: live))

    # -- scoring -------------------------------------------------------------------------------

    def score(self, pairs: list[Pair]) -> list[tuple[float, bool]]:
        """(log-likelihood of the continuation, whether greedy decoding gives it) for each pair, in order.
        Collective when `share` spans several ranks: every rank passes the same pairs."""
        rows: list[tuple[list[int], list[int]]] = []
        for ctx, cont in pairs:
            if len(cont) > self.max_length:
                raise UsageError(f"a continuation of {len(cont)} tokens is longer than the model's context "
                                 f"({self.max_length} tokens)")
            rows.append(((ctx + cont)[-(self.max_length + 1):][:-1], cont))  # HFLM: left-truncated, last token dropped
        order = sorted(range(len(rows)), key=lambda i: (-len(rows[i][0]) - len(rows[i][1]), i))  # longest first
        batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        world, rank = self.share.world_size, self.share.rank
        mine = batches[rank::world]
        mine += [[]] * (math.ceil(len(batches) / world) - len(mine))  # equal forward counts on every rank
        scored: dict[int, tuple[float, bool]] = {}
        for batch in mine:
            scored.update(self._score_batch([(i, *rows[i]) for i in batch]))
        if world > 1:
            for part in self.share.gather(scored):
                scored.update(part)
        return [scored[i] if rows[i][1] else (0.0, True) for i in range(len(rows))]

    def _score_batch(self, batch: list[tuple[int, list[int], list[int]]]) -> dict[int, tuple[float, bool]]:
        """One forward over `batch` (index, input, continuation), padded on the right; an empty batch still
        runs one forward (a collective under sharding) and scores nothing."""
        width = self.max_length if self.fixed_shape else max((len(inp) for _, inp, _ in batch), default=1)
        height = self.batch_size if self.fixed_shape else max(len(batch), 1)
        idx = torch.full((height, width), self.eot_token_id, dtype=torch.long)
        for r, (_, inp, _) in enumerate(batch):
            idx[r, :len(inp)] = torch.tensor(inp, dtype=torch.long)
        with torch.no_grad():
            logits = self.forward(idx.to(self._device))  # (B, T, V)
        out: dict[int, tuple[float, bool]] = {}
        for r, (i, inp, cont) in enumerate(batch):
            if not cont:
                continue
            picked = F.log_softmax(logits[r, len(inp) - len(cont):len(inp)].float(), dim=-1)  # (len(cont), V)
            target = torch.tensor(cont, dtype=torch.long, device=picked.device)
            ll = picked.gather(1, target[:, None]).sum()
            greedy = (picked.argmax(dim=-1) == target).all()
            out[i] = (float(ll), bool(greedy))
        return out
