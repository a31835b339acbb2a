"""The spike score against a direct transcription of OLMo-core's StabilityMonitor rule."""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest

from rrtrain.report.spikes import spike_score


def olmo_rule(losses, window=128, threshold=6.0):
    """One value at a time: spike if > mean + threshold·std (population) of the previous `window`
    values, tested only with a full window and std >= 1e-10; every finite value joins the window.
    (Non-finite values: spikes that stay out of the window, rrtrain's documented deviation.)"""
    hist: deque[float] = deque(maxlen=window)
    spikes = 0
    for x in losses:
        if not math.isfinite(x):
            spikes += 1
            continue
        if len(hist) == window:
            mean = sum(hist) / window
            std = math.sqrt(sum((h - mean) ** 2 for h in hist) / window)
            if std >= 1e-10 and x > mean + threshold * std:
                spikes += 1
        hist.append(x)
    return spikes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_the_rule_on_noisy_curves_with_spikes(seed):
    rng = np.random.default_rng(seed)
    n = 5000
    loss = 2.0 + 3.0 * np.exp(-np.arange(n) / 800) + rng.normal(0, 0.02, n)
    idx = rng.choice(np.arange(130, n), size=12, replace=False)
    loss[idx] += rng.uniform(0.05, 1.0, size=12)  # some clear spikes, some borderline
    loss[rng.choice(n, 3, replace=False)] = np.nan
    got = spike_score(loss)
    expected = olmo_rule(loss.tolist())
    assert got.spikes == expected
    assert got.steps == n and got.nonfinite == 3
    assert got.score == pytest.approx(expected / n)
    assert 3 < expected  # the test exercises real spikes


def test_short_and_flat_curves():
    assert spike_score(np.linspace(3, 2, 128)).score is None  # nothing can be tested
    flat = np.full(300, 2.0)
    flat[200] = 2.5
    assert spike_score(flat).spikes == 0  # std < 1e-10: never flags (OLMo-core)
    rising = np.concatenate([2.0 + 0.01 * np.sin(np.arange(200)), [3.0], 2.0 + 0.01 * np.sin(np.arange(99))])
    s = spike_score(rising)
    assert (s.spikes, s.steps) == (1, 300) and s.score == pytest.approx(1 / 300)
