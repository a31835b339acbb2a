"""A loss curve cut down to what a plot can show, so the report keeps a bounded number of points per run.

A panel of `curves.png` is about 400 pixels wide; a curve of 3,000 or 300,000 steps is drawn with the same
pixels. `downsample` splits the steps into equal buckets and keeps, from each, the lowest and the highest loss
and its first non-finite one (a NaN draws a gap), plus the first and last point: the envelope a plot of the
full curve draws, spikes included, at a few points per pixel column. A curve that already fits is kept whole.
"""

from __future__ import annotations

import numpy as np

MAX_CURVE_POINTS = 1202
"""At most this many points of a curve are kept: 400 buckets x 3 (min, max, first non-finite) + the ends."""


def downsample(steps: np.ndarray, values: np.ndarray, max_points: int = MAX_CURVE_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of at most `max_points` points (ordered by step, as given); copies, never views."""
    n = len(values)
    if n <= max_points:
        return np.array(steps, copy=True), np.array(values, dtype=float, copy=True)
    buckets = max(1, (max_points - 2) // 3)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    group = np.repeat(np.arange(buckets), np.diff(edges))
    v = np.asarray(values, dtype=float)
    finite = np.isfinite(v)
    first = edges[:-1]  # a bucket's first position in an order sorted by bucket first
    lowest = np.lexsort((np.where(finite, v, np.inf), group))[first]
    highest = np.lexsort((np.where(finite, -v, np.inf), group))[first]
    odd = np.lexsort((finite, group))[first]  # non-finite sorts first within its bucket
    odd = odd[~finite[odd]]
    keep = np.unique(np.concatenate(([0, n - 1], lowest, highest, odd)))
    return np.asarray(steps)[keep].copy(), v[keep].copy()
