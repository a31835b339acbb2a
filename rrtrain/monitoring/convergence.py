"""Convergence monitor: flags runs that will not converge while they run, so no GPU-hours burn on them.

- `stalled`: from `monitor.min_steps` on (and past warmup), the smoothed training loss changed by less than
  `monitor.min_improvement` (relative, either way: a plateau; a rising loss is not a stall) over the last
  `monitor.window` steps while it is still above the
  training data's unigram entropy minus `monitor.entropy_margin`: the run has learned no more than token
  frequencies. It does not look at gradients (at 40 sublayers the convex gate stalls with a healthy
  gradient profile).
- `vanishing_gradient`: on a diagnostic step the first block's gradient norm is below `monitor.grad_ratio`
  times the last block's. Independent of `stalled`.
- `diverged`: the loss stays above the smoothed loss by `monitor.spike_sigma` standard deviations of the
  recent losses for `monitor.spike_patience` steps in a row (non-finite losses are `NonfiniteGuard`'s).

`LossMonitor` is pure (records in, flags out, JSON state; no torch) so the sweep-level check runs the same test
on a run's files (`launchers.state.flags`, `rrtrain status`) without importing the trainer;
`rrtrain.monitoring.callback.MonitorCallback` puts it on the training loop.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from rrtrain.config import MonitorConfig

STALLED, DIVERGED, VANISHING = "stalled", "diverged", "vanishing_gradient"


@dataclass(frozen=True)
class Flag:
    name: str
    step: int
    detail: str


def smoothing_span(window: int) -> int:
    """The EMA's span: a quarter of the window, so the smoothed loss follows a plateau well inside it."""
    return max(2, window // 4)


class LossMonitor:
    """Watches one run's per-step records; each flag is raised once, at the first step it holds."""

    def __init__(self, cfg: MonitorConfig, unigram_entropy: Optional[float], start_step: int = 0) -> None:
        self.cfg, self.entropy = cfg, unigram_entropy
        self.start_step = max(cfg.min_steps, start_step)  # no stall before min_steps nor before warmup ends
        self.alpha = 2.0 / (smoothing_span(cfg.window) + 1)
        self.ema: Optional[float] = None
        self.smoothed: deque[float] = deque(maxlen=cfg.window + 1)  # the EMA at each of the last window+1 steps
        self.recent: deque[float] = deque(maxlen=cfg.window)  # raw losses not inside a spike
        self.recent_sum, self.recent_sq = 0.0, 0.0  # their sum and sum of squares
        self.spike = 0  # consecutive steps above the spike threshold
        self.raised: dict[str, dict[str, Any]] = {}

    def update(self, record: dict[str, Any]) -> list[Flag]:
        """Feed one training record (`step`, `loss`, optionally `block_grad_norm`); returns newly raised flags."""
        step, out = int(record["step"]), []
        loss = record.get("loss")
        if isinstance(loss, (int, float)) and math.isfinite(loss) and not record.get("skipped"):
            out += self._loss(step, float(loss))
        norms = record.get("block_grad_norm")
        if norms and len(norms) >= 2:
            out += self._gradients(step, norms)
        for flag in out:
            self.raised[flag.name] = {"step": flag.step, "detail": flag.detail}
        return out

    def feed(self, records: Iterable[dict[str, Any]]) -> list[Flag]:
        return [flag for rec in records for flag in self.update(rec)]

    def _loss(self, step: int, loss: float) -> list[Flag]:
        cfg, out = self.cfg, []
        if len(self.recent) >= max(2, cfg.window // 2):
            n = len(self.recent)
            mean = self.recent_sum / n
            std = math.sqrt(max(0.0, self.recent_sq - n * mean * mean) / (n - 1))
            threshold = self.ema + cfg.spike_sigma * std
            if loss > threshold:
                self.spike += 1  # a spike does not move the baseline it is judged against
                if self.spike >= cfg.spike_patience and DIVERGED not in self.raised:
                    out.append(Flag(DIVERGED, step, f"loss {loss:.4f} above {threshold:.4f} (smoothed {self.ema:.4f} "
                                    f"+ {cfg.spike_sigma:g} x std {std:.4f}) for {self.spike} steps"))
                return out
        self.spike = 0
        if len(self.recent) == self.recent.maxlen:  # running sums: the spike test is O(1) per step
            old = self.recent[0]
            self.recent_sum, self.recent_sq = self.recent_sum - old, self.recent_sq - old * old
        self.recent.append(loss)
        self.recent_sum, self.recent_sq = self.recent_sum + loss, self.recent_sq + loss * loss
        self.ema = loss if self.ema is None else self.ema + self.alpha * (loss - self.ema)
        self.smoothed.append(self.ema)
        if STALLED not in self.raised and self.stalled(step):
            past, now = self.smoothed[0], self.smoothed[-1]
            out.append(Flag(STALLED, step, f"smoothed loss {now:.4f} improved {100 * (past - now) / past:.2f}% over "
                            f"{cfg.window} steps; unigram entropy {self.entropy:.4f}"))
        return out

    def stalled(self, step: int) -> bool:
        """The plateau test on the current window."""
        cfg = self.cfg
        if self.entropy is None or step < self.start_step or len(self.smoothed) <= cfg.window:
            return False
        past, now = self.smoothed[0], self.smoothed[-1]
        improved = (past - now) / abs(past) if past else 0.0
        return abs(improved) < cfg.min_improvement and now > self.entropy - cfg.entropy_margin

    def _gradients(self, step: int, norms: list[float]) -> list[Flag]:
        first, last = norms[0], norms[-1]
        if VANISHING in self.raised or not (math.isfinite(first) and math.isfinite(last)) or last <= 0:
            return []
        if first < self.cfg.grad_ratio * last:
            return [Flag(VANISHING, step, f"first block's gradient norm {first:.3g} < {self.cfg.grad_ratio:g} x "
                         f"the last block's {last:.3g}")]
        return []

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema, "smoothed": list(self.smoothed), "recent": list(self.recent), "spike": self.spike,
                "raised": dict(self.raised), "recent_sum": self.recent_sum, "recent_sq": self.recent_sq}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A saved state, checked first (it comes from a file): ValueError naming the field that does not fit."""
        _check_state(state)
        self.ema = state.get("ema")
        self.smoothed = deque(state.get("smoothed", []), maxlen=self.cfg.window + 1)
        self.recent = deque(state.get("recent", []), maxlen=self.cfg.window)
        # the running sums as they were (recomputing them could differ in the last bit from the uninterrupted run's)
        self.recent_sum = state.get("recent_sum", sum(self.recent))
        self.recent_sq = state.get("recent_sq", sum(x * x for x in self.recent))
        self.spike = int(state.get("spike", 0))
        self.raised = dict(state.get("raised", {}))


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_state(state: Any) -> None:
    """ValueError naming the first field of a monitor state (from a checkpoint) that is not of its type."""
    if not isinstance(state, dict):
        raise ValueError(f"the monitor state is a {type(state).__name__}, not an object")
    if state.get("ema") is not None and not _number(state["ema"]):
        raise ValueError("'ema' is not a number")
    for key in ("smoothed", "recent"):
        if not (isinstance(state.get(key, []), list) and all(_number(x) for x in state.get(key, []))):
            raise ValueError(f"{key!r} is not a list of numbers")
    for key in ("recent_sum", "recent_sq"):
        if key in state and not _number(state[key]):
            raise ValueError(f"{key!r} is not a number")
    if not (type(state.get("spike", 0)) is int and state.get("spike", 0) >= 0):
        raise ValueError("'spike' is not a count")
    raised = state.get("raised", {})
    if not (isinstance(raised, dict) and all(isinstance(v, dict) and type(v.get("step")) is int
                                             and isinstance(v.get("detail"), str) for v in raised.values())):
        raise ValueError("'raised' is not a mapping of flag -> {step, detail}")
