"""The Review Residuals paper's Table 2 (its Section 5) fed in as single-seed runs: the report must give the
paper's differences, and must refuse to call any of them significant (one seed per side)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rrtrain.report import render
from rrtrain.report.analysis import Options, analyze
from rrtrain.report.collect import find_runs

# size -> (params, Review, Highway, Standard), from Table 2
TABLE2 = {
    "rr-60m": (60e6, 1.6891, 1.6923, 1.6805),
    "rr-150m": (150e6, 1.5576, 1.5625, 1.5548),
    "rr-320m": (320e6, 1.5001, 1.5042, 1.5037),
    "rr-590m": (590e6, 1.4795, 1.4889, 1.4901),
    "rr-1b": (1e9, 1.4876, 1.5031, 1.5040),
}
PAPER_HWY = ["+0.003", "+0.005", "+0.004", "+0.009", "+0.016"]
PAPER_STD = ["-0.009", "-0.003", "+0.004", "+0.011", "+0.016"]


@pytest.fixture(scope="module")
def paper(tmp_path_factory):
    root = tmp_path_factory.mktemp("paper")
    for size, (params, *losses) in TABLE2.items():
        for variant, loss in zip(("review", "highway", "standard"), losses):
            d = root / size / variant / "seed0"
            d.mkdir(parents=True)
            final = {"status": "completed", "step": 1000, "tokens": 1, "final_val_loss": loss, "best_val_loss": loss,
                     "params": params * (1.0 if variant == "review" else 1.003), "variant": variant,
                     "size": size, "seed": 0, "wall_s": 1.0, "flags": []}
            (d / "final.json").write_text(json.dumps(final))
    return analyze(find_runs(root), Options(extrapolate=[7e9]))


def test_defaults_reference_review_against_the_others(paper):
    assert paper.reference == "review"
    assert paper.baselines == ["highway", "standard"]
    assert [s.size for s in paper.sizes] == list(TABLE2)  # ordered by params


def test_differences_are_the_papers(paper):
    hwy = [render.fixed(s.comparisons["highway"].diff, 3, signed=True) for s in paper.sizes]
    std = [render.fixed(s.comparisons["standard"].diff, 3, signed=True) for s in paper.sizes]
    assert hwy == PAPER_HWY
    assert std == PAPER_STD


def test_single_seeds_are_not_significant(paper):
    for s in paper.sizes:
        for c in s.comparisons.values():
            assert c.verdict == "n/a" and c.t is None and c.p is None
            assert "≥ 2" in c.reason
        assert render.significance_cell(s, "review", ["highway", "standard"]).startswith("n/a")


def test_markdown_table_reads_like_the_paper(paper):
    lines = render.table2(paper)
    assert lines[0].startswith("| Size | review | highway | standard | highway − review | standard − review |")
    body = lines[2:]
    assert len(body) == 5
    for row, size, h, s in zip(body, TABLE2, PAPER_HWY, PAPER_STD):
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[0].startswith(size)
        assert cells[1] == f"{TABLE2[size][1]:.4f} (1)"
        assert cells[4:6] == [h, s]
        assert cells[6].startswith("n/a") and "seeds" in cells[6]
    md = render.report_md(paper, {}, "paper")
    assert "\n".join(lines) in md


def test_trend_is_an_equal_weight_fit_without_seed_spread(paper):
    x = np.log10([v[0] for v in TABLE2.values()])
    for b, col in (("highway", 2), ("standard", 3)):
        y = np.array([v[col] - v[1] for v in TABLE2.values()])
        coef, cov = np.polyfit(x, y, 1, cov=True)
        tr = paper.trends[b]
        assert not tr.weighted  # no size has an SE, so no weights
        assert tr.slope == pytest.approx(coef[0], rel=1e-9)
        assert tr.se == pytest.approx(math.sqrt(cov[0, 0]), rel=1e-7)
        assert tr.df == 3
        assert tr.extrapolation[0].params == 7e9
        # no seed spread anywhere: no power analysis is possible
        assert all(s.comparisons[b].power.seeds_needed is None for s in paper.sizes)
        assert tr.extrapolation[0].seeds_needed is None
