"""The spike score: the fraction of logged training steps whose loss is a spike.

Definition (OLMo-core `train/callbacks/stability_monitor.py`, `StabilityMonitorCallback`, the
"SpikeScore (total)" metric): a loss value is a spike when it exceeds the mean of the previous
`window` (128) values by more than `threshold` (6) standard deviations (population SD, ddof = 0).
A value is only tested once `window` values precede it, a window with SD < 1e-10 never flags, and
every value (spike or not) joins the window afterwards. The score is spikes / all logged steps.

One deliberate difference: a non-finite loss (NaN/inf) counts as a spike and does not join the
window. OLMo-core appends it, which poisons the window's mean and hides every later spike; a NaN
loss is the clearest instability there is.

The score is computed on the logged values: with `train.log_every = k`, the window spans 128·k
optimizer steps and the score is a fraction of logged steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WINDOW = 128
THRESHOLD_SD = 6.0
MIN_SD = 1e-10
_CHUNK = 4096


@dataclass(frozen=True)
class SpikeScore:
    spikes: int  # including non-finite losses
    steps: int  # logged training steps (the denominator)
    nonfinite: int  # spikes that are NaN/inf losses
    window: int = WINDOW

    @property
    def score(self) -> float | None:
        """spikes / steps; None when the curve is too short for any step to be tested (≤ window)."""
        return self.spikes / self.steps if self.steps > self.window else None


def spike_score(losses: np.ndarray, window: int = WINDOW, threshold: float = THRESHOLD_SD) -> SpikeScore:
    """Count spikes in a loss curve (ordered by step, one value per step)."""
    x = np.asarray(losses, dtype=float)
    finite = np.isfinite(x)
    nonfinite = int((~finite).sum())
    f = x[finite]
    spikes = 0
    if len(f) > window:
        # previous `window` values for each tested position i in [window, len(f)), in chunks
        for start in range(window, len(f), _CHUNK):
            stop = min(start + _CHUNK, len(f))
            hist = np.lib.stride_tricks.sliding_window_view(f[start - window : stop - 1], window)
            mean = hist.mean(axis=1)
            sd = hist.std(axis=1)
            cur = f[start:stop]
            spikes += int(np.sum((sd >= MIN_SD) & (cur > mean + threshold * sd)))
    return SpikeScore(spikes + nonfinite, len(x), nonfinite, window)
