"""rrtrain.report.stats against formulas computed here, independently of the module (and of
scipy.stats.ttest_ind / scipy.stats.nct, which the module uses)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, special

from rrtrain.report import stats
from rrtrain.report.render import fixed


def two_sided_p(t: float, df: float) -> float:
    """P(|T_df| > |t|) through the regularised incomplete beta function."""
    return float(special.betainc(df / 2.0, 0.5, df / (df + t * t)))


def t_quantile(q: float, df: float) -> float:
    return float(special.stdtrit(df, q))


# ------------------------------------------------------------------------------------------ Welch


@pytest.mark.parametrize(
    "ref, base",
    [
        ([1.4790, 1.4801, 1.4794], [1.4885, 1.4897, 1.4886]),  # 3 vs 3, like the paper's 590M row
        ([2.10, 2.30], [2.00, 2.05, 2.02, 2.01]),  # 2 vs 4, unequal spread: df far from n1+n2-2
        ([5.0, 5.1, 4.9, 5.3, 5.2], [5.0, 5.0, 5.4]),
    ],
)
def test_welch_matches_the_formulas(ref, base):
    r, b = np.array(ref), np.array(base)
    mr, mb = sum(ref) / len(ref), sum(base) / len(base)
    vr = sum((x - mr) ** 2 for x in ref) / (len(ref) - 1) / len(ref)
    vb = sum((x - mb) ** 2 for x in base) / (len(base) - 1) / len(base)
    t = (mb - mr) / math.sqrt(vr + vb)
    df = (vr + vb) ** 2 / (vr**2 / (len(ref) - 1) + vb**2 / (len(base) - 1))
    got = stats.welch(r, b)
    assert got.diff == pytest.approx(mb - mr, abs=1e-12)
    assert got.se == pytest.approx(math.sqrt(vr + vb), rel=1e-10)
    assert got.t == pytest.approx(t, rel=1e-9)
    assert got.df == pytest.approx(df, rel=1e-9)
    assert got.p == pytest.approx(two_sided_p(t, df), rel=1e-7)
    assert min(len(ref), len(base)) - 1 <= got.df <= len(ref) + len(base) - 2


def test_welch_sign_positive_when_reference_is_lower():
    got = stats.welch([1.0, 1.1, 1.05], [1.5, 1.6, 1.55])
    assert got.diff > 0 and got.t > 0


@pytest.mark.parametrize("ref, base", [([1.0], [1.0, 2.0]), ([1.0, 2.0], [3.0]), ([1.0, 1.0], [2.0, 2.0])])
def test_welch_not_applicable(ref, base):
    with pytest.raises(stats.NotApplicable):
        stats.welch(ref, base)


# ------------------------------------------------------------------------------------------ slope


def test_equal_weight_slope_matches_polyfit():
    x = np.log10([60e6, 150e6, 320e6, 590e6, 1e9])
    y = np.array([0.0032, 0.0049, 0.0041, 0.0094, 0.0155])
    coef, cov = np.polyfit(x, y, 1, cov=True)
    fit = stats.wls(x, y)
    assert fit.slope == pytest.approx(coef[0], rel=1e-10)
    assert fit.intercept == pytest.approx(coef[1], rel=1e-10)
    assert fit.se_slope == pytest.approx(math.sqrt(cov[0, 0]), rel=1e-8)
    assert fit.df == 3 and not fit.weighted
    assert fit.p == pytest.approx(two_sided_p(coef[0] / math.sqrt(cov[0, 0]), 3), rel=1e-7)


def test_weighted_slope_matches_closed_form_wls():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.5])
    y = np.array([0.1, 0.35, 0.2, 0.8, 0.9])
    w = np.array([4.0, 1.0, 9.0, 2.0, 0.5])  # inverse variances
    X = np.column_stack([np.ones_like(x), x])
    W = np.diag(w)
    xtwx_inv = np.linalg.inv(X.T @ W @ X)
    beta = xtwx_inv @ X.T @ W @ y
    resid = y - X @ beta
    s2 = float(resid @ W @ resid) / (len(x) - 2)
    cov = s2 * xtwx_inv  # invariant to rescaling w
    fit = stats.wls(x, y, w)
    assert fit.weighted
    assert fit.intercept == pytest.approx(beta[0], rel=1e-10)
    assert fit.slope == pytest.approx(beta[1], rel=1e-10)
    assert fit.se_slope == pytest.approx(math.sqrt(cov[1, 1]), rel=1e-9)
    assert fit.p == pytest.approx(two_sided_p(beta[1] / math.sqrt(cov[1, 1]), 3), rel=1e-7)
    # numpy.polyfit takes 1/sigma weights, i.e. sqrt of inverse variances
    coef = np.polyfit(x, y, 1, w=np.sqrt(w))
    assert fit.slope == pytest.approx(coef[0], rel=1e-10)
    # weighting matters here: the unweighted slope differs
    assert abs(stats.wls(x, y).slope - fit.slope) > 1e-3

    # prediction interval for a new point with the mean weight: variance s2/mean(w) + x0' cov x0
    x0 = np.array([1.0, 9.0])
    q = t_quantile(0.975, 3)
    half_pi = q * math.sqrt(s2 / w.mean() + x0 @ cov @ x0)
    half_ci = q * math.sqrt(x0 @ cov @ x0)
    pred = fit.predict(9.0)
    assert pred["fit"] == pytest.approx(x0 @ beta, rel=1e-10)
    assert pred["pi_hi"] - pred["fit"] == pytest.approx(half_pi, rel=1e-8)
    assert pred["fit"] - pred["pi_lo"] == pytest.approx(half_pi, rel=1e-8)
    assert pred["ci_hi"] - pred["fit"] == pytest.approx(half_ci, rel=1e-8)


def test_equal_weight_prediction_interval_is_the_textbook_one():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    y = np.array([1.1, 1.9, 3.2, 3.9])
    n = len(x)
    b, a = np.polyfit(x, y, 1)
    s = math.sqrt(np.sum((y - (a + b * x)) ** 2) / (n - 2))
    sxx = np.sum((x - x.mean()) ** 2)
    x0 = 10.0
    half = t_quantile(0.975, n - 2) * s * math.sqrt(1 + 1 / n + (x0 - x.mean()) ** 2 / sxx)
    pred = stats.wls(x, y).predict(x0)
    assert pred["pi_lo"] == pytest.approx(a + b * x0 - half, rel=1e-9)
    assert pred["pi_hi"] == pytest.approx(a + b * x0 + half, rel=1e-9)


def test_two_points_give_a_slope_without_uncertainty():
    fit = stats.wls([1.0, 2.0], [0.0, 0.5])
    assert fit.slope == pytest.approx(0.5)
    assert math.isnan(fit.se_slope) and fit.df == 0
    assert math.isnan(fit.predict(3.0)["pi_lo"])
    with pytest.raises(stats.NotApplicable):
        stats.wls([1.0], [0.0])
    with pytest.raises(stats.NotApplicable):
        stats.wls([2.0, 2.0, 2.0], [0.0, 1.0, 2.0])


# ------------------------------------------------------------------------------------------ power


def power_by_integration(n: int, d: float, alpha: float) -> float:
    """Power of the two-sided two-sample t-test, integrating over the chi-square of the SD estimate
    (T = (Z + delta) / sqrt(V / nu)); no noncentral-t code involved."""
    nu = 2 * n - 2
    delta = d * math.sqrt(n / 2)
    c = t_quantile(1 - alpha / 2, nu)

    def integrand(v):
        k = c * math.sqrt(v / nu)
        reject = special.ndtr(-k - delta) + special.ndtr(-k + delta)  # P(Z+delta > k) + P(Z+delta < -k)
        log_pdf = (nu / 2 - 1) * math.log(v) - v / 2 - (nu / 2) * math.log(2) - special.gammaln(nu / 2)
        return reject * math.exp(log_pdf)

    val, _ = integrate.quad(integrand, 0, np.inf, limit=200)
    return val


@pytest.mark.parametrize("d, expected", [(1.0, 17), (0.8, 26), (0.5, 64)])
def test_seeds_needed_known_answers(d, expected):
    # Cohen's tables / G*Power: two-sided, alpha 0.05, 80% power
    n = stats.seeds_needed(d, 0.05, 0.8)
    assert n == expected
    assert power_by_integration(n, d, 0.05) >= 0.8 > power_by_integration(n - 1, d, 0.05)


@pytest.mark.parametrize("n, d, alpha", [(3, 1.9, 0.05), (7, 1.2, 0.01), (17, 1.0, 0.05)])
def test_power_matches_independent_integration(n, d, alpha):
    assert stats.power_two_sample(n, d, alpha) == pytest.approx(power_by_integration(n, d, alpha), abs=1e-6)


def test_seeds_needed_edge_cases():
    assert stats.seeds_needed(50.0, 0.05, 0.8) == 2
    with pytest.raises(stats.NotApplicable):
        stats.seeds_needed(0.0, 0.05, 0.8)
    with pytest.raises(stats.NotApplicable):
        stats.seeds_needed(1e-4, 0.05, 0.8, n_max=1000)


def test_pooled_sd():
    a, b = [1.0, 2.0, 4.0], [3.0, 3.5]
    expected = math.sqrt((np.var(a, ddof=1) * 2 + np.var(b, ddof=1) * 1) / 3)
    assert stats.pooled_sd([a, b]) == pytest.approx(expected)
    assert stats.pooled_sd([a, [7.0]]) == pytest.approx(np.std(a, ddof=1))
    with pytest.raises(stats.NotApplicable):
        stats.pooled_sd([[1.0], [2.0]])


def test_holm():
    got = stats.holm([0.01, 0.04, 0.03, 0.005, math.nan])
    assert got[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert math.isnan(got[4])


# ------------------------------------------------------------------------------------------ formatting


@pytest.mark.parametrize(
    "x, places, signed, text",
    [
        (1.5031 - 1.4876, 3, True, "+0.016"),  # 0.0155 exactly; binary noise must not round it down
        (1.6805 - 1.6891, 3, True, "-0.009"),
        (1.4876, 4, False, "1.4876"),
        (None, 3, True, "—"),
        (math.nan, 3, True, "—"),
    ],
)
def test_fixed(x, places, signed, text):
    assert fixed(x, places, signed) == text
