"""The statistics behind the report: Welch's t-test, a weighted line fit with prediction intervals,
power analysis with the noncentral t distribution, and Holm's correction.

Every function takes plain numbers or sequences and returns plain numbers, so each can be checked
against an independent computation (tests/unit/rrtrain/report/test_report_stats.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats as sps


class NotApplicable(ValueError):
    """A statistic that cannot be computed from the data at hand; the message says why."""


@dataclass(frozen=True)
class WelchResult:
    """Welch's two-sample t-test of `baseline − reference` (positive: the reference has lower loss)."""

    diff: float  # mean(baseline) − mean(reference)
    se: float  # standard error of the difference, sqrt(s_r²/n_r + s_b²/n_b)
    t: float
    df: float  # Welch–Satterthwaite degrees of freedom
    p: float  # two-sided


def welch(reference: Sequence[float], baseline: Sequence[float]) -> WelchResult:
    """Welch's unequal-variance t-test via `scipy.stats.ttest_ind(baseline, reference, equal_var=False)`.

    Raises `NotApplicable` with a reason when either side has fewer than 2 values or neither side
    varies (the t statistic is then undefined).
    """
    r = np.asarray(reference, dtype=float)
    b = np.asarray(baseline, dtype=float)
    if len(r) < 2 or len(b) < 2:
        raise NotApplicable(f"{len(r)} vs {len(b)} seeds; Welch's test needs at least 2 on each side")
    vr, vb = r.var(ddof=1) / len(r), b.var(ddof=1) / len(b)
    se = math.sqrt(vr + vb)
    if se == 0.0:
        raise NotApplicable("no seed-to-seed spread on either side")
    res = sps.ttest_ind(b, r, equal_var=False)
    df = (vr + vb) ** 2 / (vr**2 / (len(r) - 1) + vb**2 / (len(b) - 1))
    return WelchResult(diff=float(b.mean() - r.mean()), se=se, t=float(res.statistic), df=float(df), p=float(res.pvalue))


@dataclass(frozen=True)
class LineFit:
    """A weighted least-squares line y = intercept + slope·x.

    Weights are relative (normalised to mean 1): the residual scatter sets the scale, as in
    statsmodels' WLS, so the standard error reflects lack of fit as well as the per-point noise.
    With equal weights this is ordinary least squares (and matches `numpy.polyfit(..., cov=True)`).
    """

    slope: float
    intercept: float
    se_slope: float  # nan with 2 points
    t: float
    p: float  # two-sided, t distribution with n − 2 degrees of freedom
    df: int  # n − 2
    n: int
    s2: float  # residual variance of a point of weight 1 (nan with 2 points)
    x_mean: float  # weighted mean of x
    sxx: float  # Σ w (x − x_mean)²
    weighted: bool

    def predict(self, x0: float, level: float = 0.95) -> dict[str, float]:
        """Fitted value at x0 with a `level` confidence interval for the line and a prediction
        interval for a new point of average weight (as precise as a typical point of the fit)."""
        y = self.intercept + self.slope * x0
        out = {"fit": y, "ci_lo": math.nan, "ci_hi": math.nan, "pi_lo": math.nan, "pi_hi": math.nan}
        if self.df < 1 or not math.isfinite(self.s2):
            return out
        q = float(sps.t.ppf(0.5 + level / 2, self.df))
        lever = 1.0 / self.n + (x0 - self.x_mean) ** 2 / self.sxx
        half_ci = q * math.sqrt(self.s2 * lever)
        half_pi = q * math.sqrt(self.s2 * (1.0 + lever))
        out.update(ci_lo=y - half_ci, ci_hi=y + half_ci, pi_lo=y - half_pi, pi_hi=y + half_pi)
        return out


def wls(x: Sequence[float], y: Sequence[float], w: Sequence[float] | None = None) -> LineFit:
    """Fit y = a + b·x by weighted least squares (`w` = inverse variances; None = equal weights)."""
    xa = np.asarray(x, dtype=float)
    ya = np.asarray(y, dtype=float)
    n = len(xa)
    if n < 2:
        raise NotApplicable(f"{n} size(s); a slope needs at least 2")
    weighted = w is not None
    wa = np.ones(n) if w is None else np.asarray(w, dtype=float)
    if not np.all(np.isfinite(wa)) or np.any(wa <= 0):
        raise NotApplicable("weights must be finite and positive")
    wa = wa / wa.mean()
    xm = float(np.sum(wa * xa) / np.sum(wa))
    ym = float(np.sum(wa * ya) / np.sum(wa))
    sxx = float(np.sum(wa * (xa - xm) ** 2))
    if sxx <= 0.0:
        raise NotApplicable("all sizes have the same parameter count")
    slope = float(np.sum(wa * (xa - xm) * (ya - ym)) / sxx)
    intercept = ym - slope * xm
    df = n - 2
    if df < 1:
        return LineFit(slope, intercept, math.nan, math.nan, math.nan, df, n, math.nan, xm, sxx, weighted)
    resid = ya - (intercept + slope * xa)
    s2 = float(np.sum(wa * resid**2) / df)
    se = math.sqrt(s2 / sxx)
    if se == 0.0:  # the points lie exactly on a line: no scatter to judge the slope against
        t = p = math.nan
    else:
        t = slope / se
        p = float(2 * sps.t.sf(abs(t), df))
    return LineFit(slope, intercept, se, t, p, df, n, s2, xm, sxx, weighted)


def power_two_sample(n: int, d: float, alpha: float) -> float:
    """Power of the two-sided two-sample t-test with n per group to detect a standardised effect d.

    Under the alternative, t follows a noncentral t with 2n − 2 degrees of freedom and
    noncentrality d·sqrt(n/2); power is the probability that |t| exceeds the critical value.
    """
    df = 2 * n - 2
    nc = abs(d) * math.sqrt(n / 2.0)
    crit = float(sps.t.ppf(1.0 - alpha / 2.0, df))
    upper = float(sps.nct.sf(crit, df, nc))
    lower = float(sps.nct.cdf(-crit, df, nc))
    # scipy's noncentral t returns nan far in the tails (e.g. df = 2, nc = 50); those tails are 0 / 1.
    if not math.isfinite(lower) and nc > 10:
        lower = 0.0
    if not math.isfinite(upper) and nc - crit > 10:
        upper = 1.0
    if not (math.isfinite(lower) and math.isfinite(upper)):
        raise NotApplicable(f"power undefined for n={n}, d={d:g}")
    return min(1.0, upper + lower)


def seeds_needed(d: float, alpha: float, power: float, n_max: int = 1_000_000) -> int:
    """Smallest n per group (≥ 2) at which the two-sided two-sample t-test reaches `power` for effect d.

    Raises `NotApplicable` when d is zero or not finite, or when more than `n_max` would be needed.
    """
    if not math.isfinite(d) or d == 0.0:
        raise NotApplicable("no difference to detect" if d == 0.0 else "effect size undefined")
    if power_two_sample(2, d, alpha) >= power:
        return 2
    lo, hi = 2, 4  # power(lo) < target; grow hi until power(hi) >= target, then bisect
    while power_two_sample(hi, d, alpha) < power:
        lo, hi = hi, hi * 2
        if lo > n_max:
            raise NotApplicable(f"more than {n_max:,} seeds per variant")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if power_two_sample(mid, d, alpha) >= power:
            hi = mid
        else:
            lo = mid
    if hi > n_max:
        raise NotApplicable(f"more than {n_max:,} seeds per variant")
    return hi


def pooled_sd(groups: Sequence[Sequence[float]]) -> float:
    """Pooled standard deviation over the groups that have at least 2 values."""
    num = 0.0
    dof = 0
    for g in groups:
        a = np.asarray(g, dtype=float)
        if len(a) >= 2:
            num += float(a.var(ddof=1)) * (len(a) - 1)
            dof += len(a) - 1
    if dof == 0:
        raise NotApplicable("no side has 2 seeds, so the seed-to-seed spread is unknown")
    return math.sqrt(num / dof)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (nan entries stay nan and do not count as tests)."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(len(p), math.nan)
    idx = [i for i in np.argsort(p, kind="stable") if math.isfinite(p[i])]
    m = len(idx)
    running = 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()
