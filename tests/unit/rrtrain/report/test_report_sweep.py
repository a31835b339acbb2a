"""A synthetic sweep directory (missing seeds, failed / stalled / diverged / spiky runs, an unfinished
run, a resumed run that re-logged steps, a torn metrics line) through analysis, text outputs and plots."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from scipy import stats as sps

from rrtrain.report import plots, render
from rrtrain.report.analysis import Options, analyze
from rrtrain.core.io import atomic_path
from rrtrain.core.io import atomic_write_text as write_text
from rrtrain.report.collect import find_runs

PARAMS = {"s-small": 50e6, "s-mid": 200e6, "s-big": 800e6}

# (size, variant, seed, status, flags, final_val_loss, train steps logged, evals logged?)
SPEC = [
    ("s-small", "review", 0, "completed", [], 2.100, 200, True),  # re-logs steps 100..120 (resumed)
    ("s-small", "review", 1, "completed", [], 2.104, 200, True),
    ("s-small", "review", 2, "completed", [], 2.098, 200, True),
    ("s-small", "highway", 0, "completed", [], 2.103, 200, True),  # one loss spike at step 180
    ("s-small", "highway", 1, "completed", [], 2.101, 200, True),
    ("s-small", "highway", 2, "completed", [], 2.106, 200, True),
    ("s-small", "review_convex", 0, "completed", [], 2.110, 200, True),
    ("s-small", "review_convex", 1, "completed", [], 2.114, 200, True),
    ("s-mid", "review", 0, "completed", [], 1.900, 200, True),
    ("s-mid", "review", 1, "completed", [], 1.903, 200, True),  # torn last line in metrics.jsonl
    ("s-mid", "review", 2, "completed", [], 1.898, 200, True),
    ("s-mid", "highway", 0, "completed", [], 1.908, 200, True),
    ("s-mid", "highway", 1, "completed", [], 1.911, 200, True),
    ("s-mid", "highway", 2, "failed", [], None, 30, False),  # failed before any eval
    ("s-mid", "review_convex", 0, "stalled", ["stalled"], 6.0, 200, True),
    ("s-mid", "review_convex", 1, "completed", [], 1.915, 200, True),  # seed 2: missing
    ("s-big", "review", 0, "completed", [], 1.700, 200, True),
    ("s-big", "review", 1, "completed", [], 1.702, 200, True),
    ("s-big", "review", 2, "diverged", ["diverged"], 9.9, 200, True),  # NaN losses at the end
    ("s-big", "highway", 0, "completed", [], 1.712, 200, True),
    ("s-big", "highway", 1, None, [], None, 80, False),  # unfinished: no final.json
    ("s-big", "review_convex", 0, "completed", [], 1.720, 200, True),
    ("s-big", "review_convex", 1, "completed", ["spiky"], 1.722, 200, True),  # seed 2: missing
]


def _curve(final: float, n: int) -> np.ndarray:
    steps = np.arange(n)
    return final + 2.0 * np.exp(-steps / 20.0) + 0.01 * np.sin(0.7 * steps)


def build_sweep(root):
    for size, variant, seed, status, flags, loss, n, evals in SPEC:
        d = root / size / variant / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(f"model:\n  size: {size}\n  variant: {variant}\ntrain:\n  seed: {seed}\n")
        y = _curve(loss if loss is not None else 3.0, n)
        lines = []
        if (size, variant, seed) == ("s-small", "highway", 0):
            y[180] += 1.0
        if status == "diverged":
            y[-5:] = np.nan
        for s in range(n):
            lines.append(json.dumps({"step": s, "loss": float(y[s]), "lr": 1e-3, "tokens": 1000 * s}))
            if evals and s % 50 == 49:
                lines.append(json.dumps({"step": s, "val_loss": float(y[s]) + 0.01, "tokens": 1000 * s}))
            if s % 60 == 0:
                lines.append(json.dumps({"kind": "diag", "step": s, "grad_norm": 1.0}))
        if (size, variant, seed) == ("s-small", "review", 0):  # resumed at step 100: steps re-logged
            lines += [json.dumps({"step": s, "loss": float(y[s]) + 0.01}) for s in range(100, 121)]
        text = "\n".join(lines) + "\n"
        if (size, variant, seed) == ("s-mid", "review", 1):
            text += '{"step": 200, "lo'
        (d / "metrics.jsonl").write_text(text)
        if status is not None:
            final = {"status": status, "step": n, "tokens": 1000 * n, "final_val_loss": loss, "best_val_loss": loss,
                     "params": PARAMS[size] * (1.0 if variant == "review" else 1.004), "variant": variant,
                     "size": size, "seed": seed, "wall_s": 12.5, "flags": flags}
            (d / "final.json").write_text(json.dumps(final))
    return root


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return build_sweep(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(scope="module")
def analysis(sweep):
    return analyze(find_runs(sweep), Options(extrapolate=[7e9]))


def losses(size, variant, include_flagged=False):
    keep = []
    for s, v, _, status, flags, loss, _, _ in SPEC:
        ok = status == "completed" and not flags
        if s == size and v == variant and loss is not None and (ok or (include_flagged and status is not None)):
            keep.append(loss)
    return keep


def test_sizes_means_and_seed_counts(analysis):
    assert [s.size for s in analysis.sizes] == ["s-small", "s-mid", "s-big"]
    assert analysis.reference == "review" and analysis.baselines == ["highway", "review_convex"]
    for s in analysis.sizes:
        assert s.params == pytest.approx(PARAMS[s.size])  # the reference's params, not the baselines'
        for v in ("review", "highway", "review_convex"):
            vs = s.variants[v]
            want = losses(s.size, v)
            assert vs.n == len(want)
            assert vs.mean == pytest.approx(np.mean(want))
            if len(want) >= 2:
                assert vs.sd == pytest.approx(np.std(want, ddof=1))
            else:
                assert vs.sd is None
    counts = {c: analysis.count(c) for c in ("ok", "flagged", "unfinished", "unusable")}
    assert counts == {"ok": 18, "flagged": 4, "unfinished": 1, "unusable": 0}


def test_comparisons(analysis):
    small, mid, big = analysis.sizes
    c = small.comparisons["highway"]
    res = sps.ttest_ind(losses("s-small", "highway"), losses("s-small", "review"), equal_var=False)
    assert (c.t, c.p) == pytest.approx((res.statistic, res.pvalue))
    assert c.verdict in ("yes", "no")
    assert mid.comparisons["highway"].n_base == 2  # the failed seed is not there
    na = mid.comparisons["review_convex"]
    assert na.verdict == "n/a" and "1 of review_convex" in na.reason
    assert na.diff == pytest.approx(1.915 - np.mean(losses("s-mid", "review")))
    assert big.comparisons["highway"].verdict == "n/a"
    assert big.comparisons["highway"].power.seeds_needed is not None  # review's 2 seeds give an SD
    # Holm is over every test that ran
    ps = [c.p for s in analysis.sizes for c in s.comparisons.values() if c.p is not None]
    assert len(ps) == 3


def test_include_flagged(sweep):
    a = analyze(find_runs(sweep), Options(include_flagged=True))
    mid, big = a.sizes[1], a.sizes[2]
    assert big.variants["review"].n == 3 and big.variants["review"].mean == pytest.approx(np.mean([1.7, 1.702, 9.9]))
    assert mid.variants["review_convex"].n == 2  # the stalled run counts now
    assert mid.variants["highway"].n == 2  # the failed run has no loss to count
    assert big.variants["review_convex"].n == 2


def test_trend_uses_equal_weights_when_a_size_lacks_an_se(analysis):
    tr = analysis.trends["highway"]
    assert tr.sizes == ["s-small", "s-mid", "s-big"] and not tr.weighted and tr.df == 1
    x = np.log10([PARAMS[s] for s in tr.sizes])
    y = [np.mean(losses(s, "highway")) - np.mean(losses(s, "review")) for s in tr.sizes]
    assert tr.slope == pytest.approx(np.polyfit(x, y, 1)[0])
    e = tr.extrapolation[0]
    assert e.beyond == pytest.approx(7e9 / 800e6)
    assert e.pi_lo < e.fit < e.pi_hi


def test_spike_scores_and_relogged_steps(analysis):
    small = analysis.sizes[0]
    assert small.variants["highway"].spike_score == pytest.approx((1 / 200) / 3)
    assert small.variants["highway"].spike_max == pytest.approx(1 / 200)
    rows = {r.run.rel: r for r in analysis.rows}
    resumed = rows["s-small/review/seed0"].run.metrics
    assert resumed.relogged == 21 and len(resumed.train_steps) == 200
    assert resumed.train_loss[110] == pytest.approx(_curve(2.1, 200)[110] + 0.01)
    assert rows["s-mid/review/seed1"].run.metrics.bad_lines == 1
    assert rows["s-big/review/seed2"].spike.nonfinite == 5
    # the spiky run is excluded from the mean but still counts in its variant's spike score
    assert analysis.sizes[2].variants["review_convex"].spike_runs == 2


def test_report_md_lists_flagged_and_unfinished(analysis):
    md = render.report_md(analysis, {}, "sweep")
    flagged = md.split("## Flagged runs")[1].split("##")[0]
    for rel in ("s-mid/highway/seed2", "s-mid/review_convex/seed0", "s-big/review/seed2", "s-big/review_convex/seed1"):
        assert rel in flagged
    assert "excluded from" in md.split("## Flagged runs")[1].splitlines()[0]
    unfinished = md.split("## Unfinished runs")[1].split("##")[0]
    assert "s-big/highway/seed1" in unfinished
    assert "[^flagged]: 4 run(s) flagged" in md
    assert "n/a: " in md or "n/a" in md
    assert "## Looking ahead" in md and "an extrapolation, not a measurement" in md


def test_results_csv_one_row_per_run(analysis):
    rows = list(csv.DictReader(io.StringIO(render.results_csv(analysis))))
    assert len(rows) == len(SPEC)
    assert sum(int(r["included"]) for r in rows) == 18
    by = {r["run"]: r for r in rows}
    assert by["s-big/highway/seed1"]["category"] == "unfinished"
    assert by["s-small/review/seed0"]["relogged_steps"] == "21"


def test_summary_json_is_strict_json(analysis):
    def no_nan(x):
        raise ValueError(x)

    data = json.loads(render.summary_json(analysis, {}, "sweep"), parse_constant=no_nan)
    assert data["runs"]["flagged"] == 4 and data["runs"]["included"] == 18
    assert [s["size"] for s in data["sizes"]] == ["s-small", "s-mid", "s-big"]
    assert data["sizes"][1]["comparisons"]["review_convex"]["verdict"] == "n/a"


# ------------------------------------------------------------------------------------------ plots


def legend_count(ax):
    return len(ax.get_legend_handles_labels()[0])


def test_loss_vs_params_plot(analysis):
    fig, expected = plots.build_loss_vs_params(analysis)
    (ax,) = fig.axes
    assert len(ax.containers) == 3 == expected[0]  # one error-bar series per variant
    assert ax.get_xscale() == "log"


def test_advantage_plot(analysis):
    fig, expected = plots.build_advantage(analysis)
    (ax,) = fig.axes
    # per baseline: points, fit, extrapolated line, prediction band
    assert len(ax.containers) == 2
    assert legend_count(ax) == 8 == expected[0]


def test_curves_plot(analysis):
    fig, expected = plots.build_curves(analysis)
    axes = fig.axes
    assert len(axes) == 6  # train row + val row, 3 sizes
    sizes = ["s-small", "s-mid", "s-big"]
    want_train = [sum(1 for s, *_, n, _ in SPEC if s == size and n) for size in sizes]
    want_val = [sum(1 for s, *_, ev in SPEC if s == size and ev) for size in sizes]
    got = [len(ax.get_lines()) for ax in axes]
    assert got == want_train + want_val == expected
    convex = 0
    for ax in axes:
        for line in ax.get_lines():
            rel = line.get_label().removeprefix("_run:")
            assert (line.get_linestyle() == "--") == rel.split("/")[1].endswith("_convex")
            convex += line.get_linestyle() == "--"
    assert convex == 6 + 6  # 6 convex runs, each with training and evaluation curves


def test_save_refuses_a_wrong_series_count(analysis, tmp_path):
    fig, expected = plots.build_loss_vs_params(analysis)
    with pytest.raises(plots.PlotError):
        plots.save(fig, [expected[0] + 1], tmp_path / "x.png")
    assert not list(tmp_path.iterdir())


def test_write_all_plots_are_pngs(analysis, tmp_path):
    done = plots.write_all(analysis, tmp_path)
    assert set(done) == {"loss_vs_params.png", "advantage.png", "curves.png"}
    from matplotlib import image

    for name in done:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        assert float(np.std(image.imread(tmp_path / name))) > 0.01  # not a blank canvas
    assert done["curves.png"]["series"] == [8, 8, 7, 8, 7, 6]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(done)  # no temporary files left


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.md"
    write_text(target, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.md"]


def test_effect_option_sets_the_planned_difference(sweep):
    from rrtrain.report import stats

    a = analyze(find_runs(sweep), Options(effect=0.004, power=0.9, alpha=0.01))
    p = a.sizes[0].comparisons["highway"].power
    sd = stats.pooled_sd([losses("s-small", "review"), losses("s-small", "highway")])
    assert (p.effect, p.effect_source) == (0.004, "--effect")
    assert p.sd == pytest.approx(sd)
    assert p.seeds_needed == stats.seeds_needed(0.004 / sd, 0.01, 0.9)
    assert p.seeds_needed > analyze(find_runs(sweep), Options(effect=0.004)).sizes[0].comparisons["highway"].power.seeds_needed


def test_a_seed_found_twice_counts_once(tmp_path):
    for where, step, loss in (("a", 100, 2.0), ("b", 200, 2.2)):
        d = tmp_path / where / "run"
        d.mkdir(parents=True)
        (d / "final.json").write_text(json.dumps({
            "status": "completed", "step": step, "final_val_loss": loss, "params": 1e6, "variant": "review",
            "size": "tiny", "seed": 0, "flags": []}))
    a = analyze(find_runs(tmp_path), Options())
    vs = a.sizes[0].variants["review"]
    assert vs.n == 1 and vs.mean == 2.2  # the run with more steps
    assert len(a.notes) == 1 and "b/run" in a.notes[0]
    assert [r.included for r in a.rows] == [False, True]
