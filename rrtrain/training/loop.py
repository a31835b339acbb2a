"""The training loop as a callback sees it: where the run stands, and the few things a callback may ask of it.

Callbacks are handed a `Loop`, never the trainer, so what they may read and do is this page and nothing else.
The module imports no torch: a user's callback module that subclasses `Callback` stays cheap to import.

`Trainer.fit` runs the step and calls, on every callback in descending `priority`:

- `on_start(loop)` once, after set-up and resume;
- `on_step_start(loop)` before each optimizer step;
- `on_train_records(loop, records)` with per-step records (`step`, `loss`, `grad_norm`, `lr`, `tokens`,
  diagnostics on diagnostic steps) in step order, in batches: whenever they reach the host. The loop keeps
  losses on the device and delivers them every `train.log_every` steps, at the stop-check cadence and before
  evaluation, checkpoints and the end; every record up to the current step has been delivered before
  `on_eval`, `on_checkpoint` and `on_end`, so a callback that treats records one at a time gives the same
  answers for any batching;
- `on_step_end(loop)` after each step (cadences: evaluation, checkpoints, the stop signal);
- `on_eval(loop, record)` with `{"step", "val_loss", "tokens"}`, and `"val/<name>"` per source of a mixture;
- `on_checkpoint(loop, record)` after a checkpoint is published (`latest` names it), with `{"kind":
  "checkpoint", "step", "published_at", "blocking_s", "write_s"}`: the step saved, the step at which it was
  published (later than `step` when written in the background, `train.ckpt_async`), the seconds the loop
  spent in it and the seconds from its start until its files were written;
- `on_flag(loop, flag)` when a callback raises a flag (`loop.raise_flag`): `{"kind": "flag", "step", "flag",
  "detail"}`;
- `on_end(loop)` once, with `loop.status` final, also when the run failed after set-up.

A callback stops the run with `loop.request_stop(status, reason)`; the loop ends at that step boundary.
Decisions that end a run must be taken on every rank alike (from all-reduced values, e.g. `loop.any_rank`),
since every rank takes part in the collectives that follow. A callback whose state must survive a resume
returns it from `state_dict()` (JSON: it is stored in the checkpoint's train_state.json under the callback's
`name`, which is therefore unique in a run) and gets it back through `load_state_dict` before `on_start`.
(Shaped after OLMo-core's `callbacks/callback.py`.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

if TYPE_CHECKING:
    from rrtrain.config import Config
    from rrtrain.resolve import ResolvedRun


@dataclass(frozen=True)
class RunFacts:
    """What is fixed once the run is set up (the config as resolved, the model's size, the ranks)."""

    config: "Config"  # read it, do not change it
    run: "ResolvedRun"  # the config resolved against the dataset: the rule's spec, shape, budget, manifest
    run_dir: Path
    rank: int
    world_size: int
    is_main: bool  # rank 0: the one that prints and writes the run's files
    device: Any  # the torch.device this rank trains on
    params: int
    seq_len: int
    tokens_per_step: int
    accum: int  # micro-batches accumulated per optimizer step on each rank
    warmup_steps: int
    flops_per_token: float
    peak_flops: float  # this device's peak, per second (for MFU)


class MetricsSink(Protocol):
    """metrics.jsonl and TensorBoard (rank 0 writes; elsewhere a no-op)."""

    def log(self, record: dict[str, Any], tb_prefix: str = "train") -> None: ...

    def log_flag(self, flag: dict[str, Any]) -> None: ...


class Loop(Protocol):
    """The interface handed to every hook."""

    facts: RunFacts
    metrics: MetricsSink

    @property
    def step(self) -> int:
        """Optimizer steps done (the step just taken, in `on_step_end` and the records' hooks)."""

    @property
    def total_steps(self) -> int: ...

    @property
    def tokens(self) -> int:
        """Tokens trained on so far, over all ranks."""

    @property
    def resumed_at(self) -> Optional[int]:
        """The checkpoint step this process started from (None: a fresh run)."""

    @property
    def status(self) -> str:
        """"completed" while training goes on; the run's ending once a stop was requested, and in `on_end`."""

    @property
    def reason(self) -> str: ...

    @property
    def last_val_loss(self) -> Optional[float]: ...

    def wall_s(self) -> float:
        """Seconds of training, over every process of this run since its first start."""

    def request_stop(self, status: str, reason: str, checkpoint: bool = True, signal: Optional[str] = None) -> None:
        """End the run at this step boundary with `status` (the first request wins); `checkpoint` saves the
        state first; `signal` names the signal that asked (final.json's `signal`)."""

    def raise_flag(self, name: str, step: int, detail: str) -> None:
        """Tell every callback (`on_flag`): metrics.jsonl, TensorBoard and the console show it."""

    def run_eval(self) -> float:
        """Collective. The validation loss now (every callback sees it in `on_eval`)."""

    def save_checkpoint(self, background: bool = False) -> None:
        """Collective. A checkpoint of this step (`background`: written while training goes on, with
        `train.ckpt_async`)."""

    def any_rank(self, flag: int) -> int:
        """Collective. The largest `flag` of any rank (a non-negative integer below 2**24; a bool counts as 0 or 1),
        so true on every rank when true on any: call it at the same steps on every rank."""

    def logits(self, idx: Any) -> Any:
        """Collective under a sharded backend (every rank calls it as often). The model's logits (B, T, V) for
        token ids (B, T), as the model is now: eval mode, no gradients, its mode restored after."""


class Callback:
    """A no-op for every hook; subclasses override what they need."""

    name = "callback"  # the key of its state in train_state.json: unique in a run
    priority = 0  # higher runs first; the built-ins use 30 to 100
    #: True when a record may make this callback stop the run at that record's own step: the loop then
    #: delivers records every step (one host sync a step) instead of in batches
    exact_records = False

    def on_start(self, loop: Loop) -> None: ...

    def on_step_start(self, loop: Loop) -> None: ...

    def on_train_records(self, loop: Loop, records: list[dict[str, Any]]) -> None: ...

    def on_step_end(self, loop: Loop) -> None: ...

    def on_eval(self, loop: Loop, record: dict[str, Any]) -> None: ...

    def on_checkpoint(self, loop: Loop, record: dict[str, Any]) -> None: ...

    def on_flag(self, loop: Loop, flag: dict[str, Any]) -> None: ...

    def on_end(self, loop: Loop) -> None: ...

    def raised_flags(self) -> dict[str, dict[str, Any]]:
        """Flags this callback raised so far: name -> {"step", "detail"} (they go into final.json)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def due(step: int, every: int, total: int) -> bool:
    """A cadence that fires every `every` steps (0: never) before the last step (the end has its own)."""
    return every > 0 and step % every == 0 and step < total
