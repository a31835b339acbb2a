"""The convergence monitor on the training loop: `rrtrain.monitoring.convergence.LossMonitor` fed the all-reduced per-step
records, each flag written to metrics.jsonl, TensorBoard and final.json, and `monitor.on_stall` /
`monitor.on_diverge: stop` turned into a checkpointed stop (status stalled / diverged)."""

from __future__ import annotations

from typing import Any, Optional

from rrtrain.config import MonitorConfig
from rrtrain.monitoring.convergence import DIVERGED, STALLED, LossMonitor
from rrtrain.training.loop import Callback, Loop


class MonitorCallback(Callback):
    """Runs `LossMonitor` on every rank on the all-reduced losses, so a stop is decided alike everywhere."""

    name, priority = "monitor", 70

    def __init__(self, cfg: MonitorConfig) -> None:
        self.cfg = cfg
        self.exact_records = "stop" in (cfg.on_stall, cfg.on_diverge)
        self.monitor: Optional[LossMonitor] = None
        self.pending: dict[str, Any] = {}

    def on_start(self, loop: Loop) -> None:
        entropy = (loop.facts.run.manifest or {}).get("unigram_entropy")
        self.monitor = LossMonitor(self.cfg, entropy, start_step=loop.facts.warmup_steps)
        self.monitor.load_state_dict(self.pending)

    def on_train_records(self, loop: Loop, records: list[dict[str, Any]]) -> None:
        for flag in self.monitor.feed(records):
            loop.raise_flag(flag.name, flag.step, flag.detail)
            action = {STALLED: self.cfg.on_stall, DIVERGED: self.cfg.on_diverge}.get(flag.name)
            if action == "stop":
                loop.request_stop(flag.name, f"monitor: {flag.name} at step {flag.step}: {flag.detail}")

    def raised_flags(self) -> dict[str, dict[str, Any]]:
        return dict(self.monitor.raised) if self.monitor else {}

    def state_dict(self) -> dict[str, Any]:
        return self.monitor.state_dict() if self.monitor else self.pending

    def load_state_dict(self, state: dict[str, Any]) -> None:
        LossMonitor(self.cfg, None).load_state_dict(state)  # checked now, before training: ValueError if unfit
        self.pending = state
        if self.monitor is not None:
            self.monitor.load_state_dict(state)
