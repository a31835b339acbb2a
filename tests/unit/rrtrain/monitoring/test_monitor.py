"""The convergence monitor on labelled synthetic loss curves, with the default thresholds (rrtrain.config).

Curves are 1000 steps of a byte-level run's shape: a fall from ln(258) ~ 5.55 nats, then what the label says,
around a unigram entropy of 3.1 nats (the synthetic-stories corpus' is 3.12)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rrtrain.config import MonitorConfig
from rrtrain.monitoring.convergence import DIVERGED, STALLED, VANISHING, LossMonitor

H = 3.1
STEPS = 1000
UNIFORM = math.log(258)


def _fall(t: np.ndarray, floor: float | np.ndarray, tau: float = 40.0) -> np.ndarray:
    """An exponential fall from the uniform distribution's loss onto `floor` (a level or a curve)."""
    return floor + (UNIFORM - floor) * np.exp(-t / tau)


def _descent(t: np.ndarray, end: float) -> np.ndarray:
    """Fast fall to just above the entropy, then a steady power-law descent to `end` at the last step."""
    return _fall(t, H + 0.2 - (H + 0.2 - end) * ((t / STEPS) ** 0.7))


def curves() -> dict[str, tuple[set[str], np.ndarray]]:
    """name -> (expected flags among stalled/diverged, loss per step 1..STEPS)."""
    rng = np.random.default_rng(0)
    t = np.arange(1, STEPS + 1, dtype=float)
    noise = lambda s: rng.normal(0.0, s, STEPS)  # noqa: E731
    out: dict[str, tuple[set[str], np.ndarray]] = {}
    out["plateau_at_entropy"] = ({STALLED}, _fall(t, H + 0.01) + noise(0.03))
    out["plateau_just_below_entropy"] = ({STALLED}, _fall(t, H - 0.05) + noise(0.05))
    out["plateau_above_entropy"] = ({STALLED}, _fall(t, H + 0.4, tau=80) + noise(0.04))
    out["stuck_at_uniform"] = ({STALLED}, UNIFORM + noise(0.02))
    out["late_plateau_after_a_bump"] = ({STALLED}, np.where(t < 300, _descent(t, 2.9), _descent(np.full_like(t, 300), 2.9))
                                        + noise(0.03))
    out["slow_real_descent"] = (set(), _descent(t, 2.6) + noise(0.03))
    out["very_slow_descent_through_entropy"] = (set(), _fall(t, 3.4 - 0.0008 * t) + noise(0.02))
    out["noisy_descent"] = (set(), _descent(t, 2.3) + noise(0.15))
    out["fast_descent"] = (set(), _fall(t, 1.5, tau=200) + noise(0.05))
    spiky = _descent(t, 2.4) + noise(0.04)
    for start in (350, 600, 820):
        spiky[start:start + 4] += np.array([1.5, 2.5, 1.2, 0.4])
    out["spikes_that_recover"] = (set(), spiky)
    long_spike = _descent(t, 2.4) + noise(0.04)
    long_spike[500:508] += 2.0  # eight steps: under the default patience of ten
    out["long_spike_that_recovers"] = (set(), long_spike)
    jump = _descent(t, 2.4) + noise(0.04)
    jump[450:] = 7.0 + noise(0.3)[450:]
    out["divergence_jump"] = ({DIVERGED}, jump)
    blowup = _descent(t, 2.4) + noise(0.04)
    blowup[400:] += 0.02 * np.exp((t[400:] - 400) / 25.0)
    out["divergence_blowup"] = ({DIVERGED}, np.minimum(blowup, 30.0))
    plateau_then_diverge = _fall(t, H) + noise(0.03)
    plateau_then_diverge[700:] += 3.0
    out["stall_then_divergence"] = ({STALLED, DIVERGED}, plateau_then_diverge)
    return out


def judge(loss: np.ndarray, cfg: MonitorConfig | None = None) -> dict[str, int]:
    mon = LossMonitor(cfg or MonitorConfig(), unigram_entropy=H, start_step=50)
    for step, value in enumerate(loss, start=1):
        mon.update({"step": step, "loss": float(value)})
    return {name: info["step"] for name, info in mon.raised.items()}


def test_labelled_curves_precision_and_recall():
    tp = {STALLED: 0, DIVERGED: 0}
    fp, fn = dict(tp), dict(tp)
    wrong = []
    for name, (expected, loss) in curves().items():
        got = judge(loss)
        for flag in (STALLED, DIVERGED):
            if flag in expected and flag in got:
                tp[flag] += 1
            elif flag in got:
                fp[flag] += 1
                wrong.append(f"{name}: false {flag} at step {got[flag]}")
            elif flag in expected:
                fn[flag] += 1
                wrong.append(f"{name}: missed {flag}")
    for flag in (STALLED, DIVERGED):
        precision = tp[flag] / max(1, tp[flag] + fp[flag])
        recall = tp[flag] / max(1, tp[flag] + fn[flag])
        print(f"{flag}: precision {precision:.2f} recall {recall:.2f} ({tp[flag]} tp, {fp[flag]} fp, {fn[flag]} fn)")
    assert not wrong, wrong


def test_a_stall_is_caught_within_two_windows_of_the_plateau():
    _, loss = curves()["plateau_at_entropy"]
    got = judge(loss)
    assert 200 <= got[STALLED] <= 400, got  # the curve is flat from about step 250; min_steps is 200


def test_no_stall_without_the_entropy_or_before_min_steps():
    _, loss = curves()["plateau_at_entropy"]
    mon = LossMonitor(MonitorConfig(), unigram_entropy=None)
    assert mon.feed({"step": s, "loss": float(v)} for s, v in enumerate(loss, 1)) == []
    assert STALLED not in judge(loss, MonitorConfig(min_steps=STEPS + 1))


def test_the_state_survives_json_and_continues_exactly():
    """A monitor restored mid-plateau raises the stall at the same step as one that never stopped."""
    _, loss = curves()["plateau_at_entropy"]
    records = [{"step": s, "loss": float(v)} for s, v in enumerate(loss, 1)]
    whole = LossMonitor(MonitorConfig(), H)
    whole.feed(records)
    first = LossMonitor(MonitorConfig(), H)
    first.feed(records[:230])
    second = LossMonitor(MonitorConfig(), H)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    second.feed(records[230:])
    assert second.raised == whole.raised and STALLED in whole.raised


def test_nonfinite_and_skipped_losses_are_left_to_the_nonfinite_guard():
    mon = LossMonitor(MonitorConfig(window=10, spike_patience=2), H)
    flags = mon.feed([{"step": s, "loss": 2.0 + 0.01 * (s % 3)} for s in range(1, 30)])
    flags += mon.feed([{"step": 30, "loss": float("nan")}, {"step": 31, "loss": 50.0, "skipped": True},
                       {"step": 32, "loss": float("inf")}])
    assert flags == [] and mon.spike == 0


@pytest.mark.parametrize("first,flagged", [(0.005, True), (0.5, False)])
def test_vanishing_gradient_compares_first_and_last_block(first, flagged):
    mon = LossMonitor(MonitorConfig(grad_ratio=0.01), H)
    got = mon.update({"step": 40, "loss": 3.0, "block_grad_norm": [first, 0.3, 0.8, 1.0]})
    assert [f.name for f in got] == ([VANISHING] if flagged else [])
    assert mon.update({"step": 80, "loss": 3.0, "block_grad_norm": [first, 1.0]}) == []  # raised once
