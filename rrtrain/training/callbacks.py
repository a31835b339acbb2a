"""The built-in callbacks: everything the loop does besides the optimizer step (the hooks, their order and
their records: `rrtrain.training.loop`). Each is given its settings when `rrtrain.train` composes a run, and
sees the run only through the `Loop` it is handed."""

from __future__ import annotations

import signal
import time
from typing import Any

from rrtrain.core.hardware import peak_memory_gb
from rrtrain.core.signals import StopFlag
from rrtrain.training.loop import Callback, Loop, due

DIAG_KEYS = ("block_grad_norm", "gate_mean", "gate_std", "gate_hist")


class Throughput(Callback):
    """Tokens/s, MFU and peak memory on the `train.log_every` records, over the time spent in steps."""

    name, priority = "throughput", 100

    def __init__(self, log_every: int) -> None:
        self.log_every = log_every
        self.window_tokens, self.window_time = 0, 0.0
        self.started: float | None = None

    def on_step_start(self, loop: Loop) -> None:
        if self.started is None:
            self.started = time.perf_counter()

    def on_train_records(self, loop: Loop, records: list[dict[str, Any]]) -> None:
        if self.started is not None:
            self.window_time += time.perf_counter() - self.started
            self.started = None
        f = loop.facts
        for rec in records:
            self.window_tokens += f.tokens_per_step
            if rec["step"] % self.log_every == 0 or rec["step"] == loop.total_steps:
                tps = self.window_tokens / max(self.window_time, 1e-9)
                rec.update({"tokens_per_s": tps, "mem_gb": peak_memory_gb(f.device),
                            "mfu": f.flops_per_token * tps / f.world_size / f.peak_flops})
                self.window_tokens, self.window_time = 0, 0.0


class MetricsWriter(Callback):
    """Training, diagnostic and evaluation records into metrics.jsonl and TensorBoard (rank 0)."""

    name, priority = "metrics", 90

    def on_train_records(self, loop: Loop, records: list[dict[str, Any]]) -> None:
        for rec in records:
            diag = {k: rec[k] for k in DIAG_KEYS if k in rec}
            loop.metrics.log({k: v for k, v in rec.items() if k not in DIAG_KEYS})
            if diag:
                loop.metrics.log({"kind": "diag", "step": rec["step"], **diag}, tb_prefix="diag")

    def on_eval(self, loop: Loop, record: dict[str, Any]) -> None:
        loop.metrics.log(record, tb_prefix="eval")

    def on_checkpoint(self, loop: Loop, record: dict[str, Any]) -> None:
        loop.metrics.log(record, tb_prefix="ckpt")

    def on_flag(self, loop: Loop, flag: dict[str, Any]) -> None:
        loop.metrics.log_flag(flag)


class NonfiniteGuard(Callback):
    """Ends the run as diverged after `train.max_nonfinite` skipped steps in a row (or the first, on halt)."""

    name, priority = "nonfinite", 80

    def __init__(self, on_nonfinite: str, max_nonfinite: int) -> None:
        self.limit = 1 if on_nonfinite == "halt" else max_nonfinite
        self.exact_records = on_nonfinite == "halt"
        self.streak = 0

    def on_train_records(self, loop: Loop, records: list[dict[str, Any]]) -> None:
        for rec in records:
            self.streak = self.streak + 1 if rec.get("skipped") else 0
            if self.streak >= self.limit:
                loop.request_stop("diverged", f"non-finite loss or gradients for {self.streak} step(s) in a row "
                                  f"at step {rec['step']}", checkpoint=False)
                return

    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak = int(state.get("streak", 0))


class Evaluator(Callback):
    """Validation loss every `train.eval_every` steps."""

    name, priority = "eval", 50

    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_end(self, loop: Loop) -> None:
        if due(loop.step, self.every, loop.total_steps):
            loop.run_eval()


class Checkpointer(Callback):
    """A checkpoint every `train.ckpt_every` steps (written in the background with `train.ckpt_async`)."""

    name, priority = "checkpoint", 40

    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_end(self, loop: Loop) -> None:
        if due(loop.step, self.every, loop.total_steps):
            loop.save_checkpoint(background=True)


class StopSignal(Callback):
    """Agree across ranks on a stop signal (SIGTERM, SIGUSR1/2, SIGINT) and end the run as preempted (the same
    all-reduce tells the loop whether a checkpoint written in the background is complete everywhere).

    Its handlers are installed from `on_start` to `on_end`. Checked every `train.stop_check_every` steps (a
    collective and a host sync: not every step): a run stops at most that many steps after the signal."""

    name, priority = "signal", 30

    def __init__(self, flag: StopFlag, every: int) -> None:
        self.flag, self.every = flag, every

    def on_start(self, loop: Loop) -> None:
        self.flag.install()

    def on_step_end(self, loop: Loop) -> None:
        if loop.step % self.every:
            return
        # the signal's number, agreed: every rank records the same one, whichever rank took it first (a warning
        # sent to every task reaches the nodes at different moments)
        signum = loop.any_rank(self.flag.signum or 0)
        if signum:
            name = signal.Signals(signum).name
            loop.request_stop("preempted", f"stopped by {name} at step {loop.step}", signal=name)

    def on_end(self, loop: Loop) -> None:
        self.flag.restore()
