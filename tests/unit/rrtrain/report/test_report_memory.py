"""The report reduces each run as it reads it: a bounded curve per run, the numbers of the whole curve kept."""

from __future__ import annotations

import json
import math
import tracemalloc

import numpy as np
import pytest

from rrtrain.report import render
from rrtrain.report.analysis import analyze
from rrtrain.report.collect import find_runs, read_metrics, read_run
from rrtrain.report.curves import MAX_CURVE_POINTS, downsample
from rrtrain.report.options import Options
from rrtrain.report.spikes import spike_score

STEPS, RUNS = 6000, 4


def loss(s: int) -> float:
    if s == 2500:
        return 9.0  # a spike
    if s == 4000:
        return float("nan")
    return 5.0 - s / 2000 + 0.01 * math.sin(s)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("long") / "sweep"
    for i in range(RUNS):
        d = root / f"run{i}"
        d.mkdir(parents=True)
        lines = []
        for s in range(1, STEPS + 1):
            lines.append(json.dumps({"step": s, "loss": loss(s) + i * 1e-3}))
            if s % 100 == 0:
                lines.append(json.dumps({"step": s, "val_loss": 5.0 - s / 2000}))
        (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        (d / "final.json").write_text(json.dumps({
            "status": "completed", "step": STEPS, "final_val_loss": 2.0 + i * 0.01, "best_val_loss": 2.0,
            "params": 1e6, "variant": ("review", "standard")[i % 2], "size": "tiny", "seed": i // 2}))
    return root


def test_a_run_read_by_the_report_keeps_a_bounded_curve_and_the_whole_curves_numbers(sweep):
    read_run(sweep / "run0", sweep)  # whatever the readers import on first use is not a run's
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        runs = find_runs(sweep)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # a run's whole training curve is 6,000 steps x 16 bytes = 96 KB in arrays alone; what stays is bounded
    assert held / RUNS < 48 * 1024, f"{held / RUNS / 1024:.0f} KB held per run after reading"
    full = read_metrics(sweep / "run0" / "metrics.jsonl")
    for run in runs:
        m = run.metrics
        assert len(m.train_steps) == len(m.train_loss) <= MAX_CURVE_POINTS
        assert (m.train_points, m.val_points, m.last_train_step) == (STEPS, STEPS // 100, STEPS)
        assert m.val_steps.tolist() == list(range(100, STEPS + 1, 100))  # a short curve is kept whole
        assert 2500 in m.train_steps.tolist() and 4000 in m.train_steps.tolist()  # the spike and the gap
    m0 = runs[0].metrics
    assert m0.last_train_loss == full.train_loss[-1]
    whole = spike_score(full.train_loss)
    assert (m0.spike.spikes, m0.spike.steps, m0.spike.nonfinite) == (whole.spikes, whole.steps, whole.nonfinite)
    csv = render.results_csv(analyze(runs, Options()))
    row = dict(zip(csv.splitlines()[0].split(","), csv.splitlines()[1].split(",")))
    assert (row["train_points"], row["val_points"], row["spikes"]) == (str(STEPS), str(STEPS // 100), "2")


def test_downsampling_keeps_the_envelope_the_ends_and_the_gaps():
    rng = np.random.default_rng(0)
    n = 50_000
    steps = np.arange(1, n + 1) * 2
    y = rng.normal(3.0, 0.1, n)
    y[[7, 31_000]] = [50.0, -1.0]
    y[20_000] = np.inf
    y[40_000:40_010] = np.nan
    xs, ys = downsample(steps, y)
    assert len(xs) <= MAX_CURVE_POINTS and np.all(np.diff(xs) > 0)
    assert xs[0] == steps[0] and xs[-1] == steps[-1]
    assert {16, 62_002, 40_002, 80_002} <= set(xs.tolist())  # spike, dip, inf, the first NaN of the run
    edges = np.linspace(0, n, (MAX_CURVE_POINTS - 2) // 3 + 1).astype(int)
    kept = dict(zip(xs.tolist(), ys.tolist()))
    for lo, hi in zip(edges[:-1], edges[1:]):  # each bucket's lowest and highest finite loss are drawn
        seg = y[lo:hi][np.isfinite(y[lo:hi])]
        inside = [v for s, v in kept.items() if steps[lo] <= s <= steps[hi - 1] and math.isfinite(v)]
        assert min(inside) == seg.min() and max(inside) == seg.max()
    short_x, short_y = downsample(steps[:MAX_CURVE_POINTS], y[:MAX_CURVE_POINTS])
    assert np.array_equal(short_x, steps[:MAX_CURVE_POINTS]) and short_y.tobytes() == y[:MAX_CURVE_POINTS].tobytes()
