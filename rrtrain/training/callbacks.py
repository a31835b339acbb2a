"""The training loop's seam: named hooks that everything beside the optimizer step plugs into.

`Trainer.fit` runs the step and calls, on every callback in descending `priority`:

- `on_start(trainer)` once, after set-up and resume;
- `on_step_start(trainer)` before each optimizer step;
- `on_train_records(trainer, records)` with per-step records (`step`, `loss`, `grad_norm`, `lr`, `tokens`,
  diagnostics on diagnostic steps) in step order, in batches: whenever they reach the host. The loop keeps
  losses on the device and delivers them every `train.log_every` steps, at the stop-check cadence and before
  evaluation, checkpoints and the end; every record up to the current step has been delivered before
  `on_eval`, `on_checkpoint` and `on_end`, so a callback that treats records one at a time gives the same
  answers for any batching;
- `on_step_end(trainer)` after each step (cadences: evaluation, checkpoints, the stop signal);
- `on_eval(trainer, record)` with `{"step", "val_loss", "tokens"}`;
- `on_checkpoint(trainer, record)` after a checkpoint is published (`latest` names it), with `{"kind":
  "checkpoint", "step", "published_at", "blocking_s", "write_s"}`: the step saved, the step at which it was
  published (later than `step` when written in the background, `train.ckpt_async`), the seconds the loop
  spent in it and the seconds from its start until its files were written;
- `on_flag(trainer, flag)` when a callback raises a flag (`trainer.raise_flag`): `{"kind": "flag", "step", "flag",
  "detail"}`;
- `on_end(trainer)` once, with `trainer.status` final, also when the run failed.

A callback stops the run with `trainer.request_stop(status, reason)`; the loop ends at that step boundary.
Decisions that end a run must be taken on every rank alike (from all-reduced values), since every rank takes
part in the collectives that follow. A callback whose state must survive a resume returns it from
`state_dict()` (JSON: it is stored in the checkpoint's train_state.json) under its `name`.
(Shaped after OLMo-core's `callbacks/callback.py`.)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from rrtrain.core import dist
from rrtrain.core.hardware import peak_memory_gb

if TYPE_CHECKING:
    from rrtrain.training.trainer import Trainer

DIAG_KEYS = ("block_grad_norm", "gate_mean", "gate_std", "gate_hist")


class Callback:
    """A no-op for every hook; subclasses override what they need."""

    name = "callback"
    priority = 0  # higher runs first

    def on_start(self, trainer: "Trainer") -> None: ...

    def on_step_start(self, trainer: "Trainer") -> None: ...

    def on_train_records(self, trainer: "Trainer", records: list[dict[str, Any]]) -> None: ...

    def on_step_end(self, trainer: "Trainer") -> None: ...

    def on_eval(self, trainer: "Trainer", record: dict[str, Any]) -> None: ...

    def on_checkpoint(self, trainer: "Trainer", record: dict[str, Any]) -> None: ...

    def on_flag(self, trainer: "Trainer", flag: dict[str, Any]) -> None: ...

    def on_end(self, trainer: "Trainer") -> None: ...

    def raised_flags(self) -> dict[str, dict[str, Any]]:
        """Flags this callback raised so far: name -> {"step", "detail"} (they go into final.json)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def due(step: int, every: int, total: int) -> bool:
    """A cadence that fires every `every` steps (0: never) before the last step (the end has its own)."""
    return every > 0 and step % every == 0 and step < total


class Throughput(Callback):
    """Tokens/s, MFU and peak memory on the `train.log_every` records, over the time spent in steps."""

    name, priority = "throughput", 100

    def __init__(self) -> None:
        self.window_tokens, self.window_time = 0, 0.0
        self.started: float | None = None

    def on_step_start(self, trainer: "Trainer") -> None:
        if self.started is None:
            self.started = time.perf_counter()

    def on_train_records(self, trainer: "Trainer", records: list[dict[str, Any]]) -> None:
        if self.started is not None:
            self.window_time += time.perf_counter() - self.started
            self.started = None
        for rec in records:
            self.window_tokens += trainer.tokens_per_step
            if rec["step"] % trainer.cfg.train.log_every == 0 or rec["step"] == trainer.total_steps:
                tps = self.window_tokens / max(self.window_time, 1e-9)
                rec.update({"tokens_per_s": tps, "mem_gb": peak_memory_gb(trainer.info.device),
                            "mfu": trainer.flops_per_token * tps / trainer.info.world_size / trainer.peak})
                self.window_tokens, self.window_time = 0, 0.0


class MetricsWriter(Callback):
    """Training, diagnostic and evaluation records into metrics.jsonl and TensorBoard (rank 0)."""

    name, priority = "metrics", 90

    def on_train_records(self, trainer: "Trainer", records: list[dict[str, Any]]) -> None:
        for rec in records:
            diag = {k: rec[k] for k in DIAG_KEYS if k in rec}
            trainer.log.log({k: v for k, v in rec.items() if k not in DIAG_KEYS})
            if diag:
                trainer.log.log({"kind": "diag", "step": rec["step"], **diag}, tb_prefix="diag")

    def on_eval(self, trainer: "Trainer", record: dict[str, Any]) -> None:
        trainer.log.log(record, tb_prefix="eval")

    def on_checkpoint(self, trainer: "Trainer", record: dict[str, Any]) -> None:
        trainer.log.log(record, tb_prefix="ckpt")

    def on_flag(self, trainer: "Trainer", flag: dict[str, Any]) -> None:
        trainer.log.log_flag(flag)


class NonfiniteGuard(Callback):
    """Ends the run as diverged after `train.max_nonfinite` skipped steps in a row (or the first, on halt)."""

    name, priority = "nonfinite", 80

    def __init__(self) -> None:
        self.streak = 0

    def on_train_records(self, trainer: "Trainer", records: list[dict[str, Any]]) -> None:
        t = trainer.cfg.train
        for rec in records:
            self.streak = self.streak + 1 if rec.get("skipped") else 0
            if self.streak and (t.on_nonfinite == "halt" or self.streak >= t.max_nonfinite):
                trainer.request_stop("diverged", f"non-finite loss or gradients for {self.streak} step(s) in a row "
                                     f"at step {rec['step']}", checkpoint=False)
                return

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak = int(state.get("streak", 0))


class Evaluator(Callback):
    """Validation loss every `train.eval_every` steps."""

    name, priority = "eval", 50

    def on_step_end(self, trainer: "Trainer") -> None:
        if due(trainer.step, trainer.cfg.train.eval_every, trainer.total_steps):
            trainer.run_eval()


class Checkpointer(Callback):
    """A checkpoint every `train.ckpt_every` steps (written in the background with `train.ckpt_async`)."""

    name, priority = "checkpoint", 40

    def on_step_end(self, trainer: "Trainer") -> None:
        if due(trainer.step, trainer.cfg.train.ckpt_every, trainer.total_steps):
            trainer.save_checkpoint(background=True)


class StopSignal(Callback):
    """Agree across ranks on a stop signal (SIGTERM, SIGUSR1/2, SIGINT) and end the run as preempted; in the
    same all-reduce, on whether every rank has written the checkpoint in flight, which is then published.

    Checked every `train.stop_check_every` steps: a run stops at most that many steps after the signal."""

    name, priority = "signal", 30

    def __init__(self, flag) -> None:
        self.flag = flag

    def on_step_end(self, trainer: "Trainer") -> None:
        if trainer.step % trainer.cfg.train.stop_check_every:  # a collective and a host sync: not every step
            return
        mine = [1.0 if self.flag.signum else 0.0, 1.0 if trainer.ckpt.writing() else 0.0]
        raised, writing = dist.all_reduce(torch.tensor(mine, device=trainer.info.device), "max").tolist()
        if trainer.ckpt.in_flight is not None and not writing:
            trainer.finish_checkpoint()  # written everywhere: publishing it waits for nothing
        if raised > 0:
            trainer.signal_name = self.flag.name or "remote"
            trainer.request_stop("preempted", f"stopped by {trainer.signal_name} at step {trainer.step}")
