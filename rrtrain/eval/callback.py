"""`eval.downstream`: lm-evaluation-harness tasks evaluated inside training, at fixed steps.

Evaluations fall on checkpoint steps (every `every` steps, a multiple of `train.ckpt_every`; by default every
checkpoint) and on the run's last step, before that step's checkpoint is written, so `rrtrain eval RUN_DIR
--step S` evaluates the very weights an in-loop record of step S describes. Each is one metrics.jsonl record
`{"kind": "downstream", "step", "seconds", "downstream/TASK/METRIC": value, ...}` (no standard errors),
mirrored to TensorBoard as `eval/downstream/TASK/METRIC` and to W&B, and one console line with its cost in
training steps.

Resume is exact: a resumed run cuts metrics.jsonl back to its checkpoint's step and recomputes what follows,
evaluations included, since they fall at the same steps; the checkpoint remembers the last step evaluated
(this callback's state), so the last step is evaluated once even when a run was stopped on it before its
evaluation. On several ranks, each scores its share of the requests through the wrapped model (every rank runs
as many forwards) and the scores are gathered (rrtrain.eval.lm); every rank computes the same metrics and rank 0
logs them. Python's, NumPy's and torch's random state are left as found (rrtrain.eval.harness). A generation task
(`generate_until`) decodes greedily through the training model's plain forward at the shape of every other
evaluation forward (eval.downstream.batch_size x seq_len, so a compiled model sees no new shape), one forward per
generated token: its cost grows with the task's `max_gen_toks` (rrtrain.eval.generate).
"""

from __future__ import annotations

import contextlib
import io
import time
from typing import Any, Callable, Iterator, Optional

from rrtrain.config import DownstreamConfig
from rrtrain.core import dist
from rrtrain.training.loop import Callback, Loop, due

#: where else a record goes (W&B): (step, record, prefix) -> None
Mirror = Callable[[int, dict[str, Any], str], None]


class DownstreamEval(Callback):
    """Runs the evaluation at its steps; before the checkpointer (40), so a step's checkpoint records it."""

    name, priority = "downstream", 45

    def __init__(self, cfg: DownstreamConfig, ckpt_every: int) -> None:
        """Refuses an unknown task or a bad `include` (one line) before the run writes anything."""
        from rrtrain.eval.tasks import check_include, parse_tasks, require_lm_eval, task_manager

        require_lm_eval("eval.downstream.tasks")
        self.cfg = cfg
        self.tasks = parse_tasks(cfg.tasks, "eval.downstream.tasks")
        self.every = ckpt_every if cfg.every is None else cfg.every
        include = check_include(cfg.include, "eval.downstream.include")
        self.manager = task_manager(self.tasks, include, "eval.downstream.tasks")
        self.loaded: Optional[dict] = None
        self.tokenizer: Any = None
        self.last: Optional[int] = None  # the last step evaluated (the checkpoint keeps it)
        self.mark = (0.0, 0)  # (time, step) since which training time is measured, for the cost in steps
        self.mirrors: list[Mirror] = []

    def on_start(self, loop: Loop) -> None:
        from data_prep.tokenizer import load_from_dataset
        from rrtrain.data.sources import tokenizer_path
        from rrtrain.eval.tasks import check_generation, load_tasks

        with quiet():
            self.loaded = load_tasks(self.manager, self.tasks, self.cfg.num_fewshot, "eval.downstream.tasks")
        check_generation(self.loaded, loop.facts.seq_len, "eval.downstream.tasks")
        self.tokenizer = load_from_dataset(str(tokenizer_path(loop.facts.config.data)))
        self.mark = (time.perf_counter(), loop.step)

    def on_step_end(self, loop: Loop) -> None:
        if due(loop.step, self.every, loop.total_steps) and self.last != loop.step:
            self.evaluate(loop)

    def on_eval(self, loop: Loop, record: dict[str, Any]) -> None:
        if loop.step == loop.total_steps and self.last != loop.step:  # the run's end (its own evaluation)
            self.evaluate(loop)

    def evaluate(self, loop: Loop) -> None:
        """Collective: every rank evaluates its share; rank 0 logs the record and prints its cost."""
        from rrtrain.eval import harness
        from rrtrain.eval.lm import RRTrainLM, Share

        f, step = loop.facts, loop.step
        started = time.perf_counter()
        lm = RRTrainLM(loop.logits, self.tokenizer, f.seq_len, device=f.device, batch_size=self.cfg.batch_size,
                       share=Share(f.rank, f.world_size, dist.gather_objects), fixed_shape=True)
        with quiet():
            found = harness.run(lm, self.loaded, self.cfg.limit, bootstrap_iters=0)
        seconds = time.perf_counter() - started
        record = {"kind": "downstream", "step": step, "seconds": round(seconds, 3), **harness.records(found)}
        self.last = step
        loop.metrics.log(record, tb_prefix="eval")
        for mirror in self.mirrors:
            mirror(step, record, "eval")
        if f.is_main:
            print(cost_line(step, seconds, self.mark, started, found), flush=True)
        self.mark = (time.perf_counter(), step)

    def state_dict(self) -> dict[str, Any]:
        return {"last": self.last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        last = state.get("last")
        self.last = None if last is None else int(last)


def cost_line(step: int, seconds: float, mark: tuple[float, int], now: float, found: dict) -> str:
    """`downstream eval at step S: X s, = Y steps | task/metric value ...`: its cost in training steps at the
    pace since the previous evaluation (or the start), so a user can size `every`."""
    from rrtrain.eval.harness import records

    since, at = mark
    pace = (now - since) / (step - at) if step > at else None
    steps = f", = {seconds / pace:.1f} steps" if pace else ""
    values = " | ".join(f"{k[len('downstream/'):]} {v:.4f}" if v is not None else f"{k[len('downstream/'):]} nan"
                        for k, v in records(found).items())
    return f"rrtrain: downstream eval at step {step}: {seconds:.1f} s{steps} | {values}"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """lm-eval's and datasets' progress bars and notes off the run's console (an error still propagates)."""
    with contextlib.redirect_stderr(io.StringIO()):
        yield
