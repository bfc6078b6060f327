"""Is a group different from the baseline? Paired or Welch t-tests, Holm's correction, and power.

A comparison is made on the runs' final values of the report's metric. When the group and the
baseline ran the same seeds (train.seed fixes both the initialisation and the batch order), the
runs of one seed share most of their noise, and the paired t-test on the per-seed differences
removes it; otherwise Welch's unequal-variance test compares the two sets of seeds. For each
comparison it also says what the seeds could have found: the smallest difference they detect with
80% power at alpha 0.05 (from the observed spread), and how many seeds the observed difference
would need for that power. docs/research.md works through each number.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

ALPHA = 0.05  # two-sided test level, for each comparison and for the Holm-corrected family
POWER = 0.8  # the power at which detectable differences and seeds needed are quoted
LEVEL = 0.95  # confidence intervals
MAX_SEEDS = 1_000_000  # seeds_needed gives up beyond this


@dataclass
class Welch:
    """Welch's unequal-variance t-test of a group's final losses against the baseline's."""

    t: float
    df: float
    p: float  # two-sided

    @property
    def significant(self) -> bool:
        return self.p < ALPHA


def _variance(x: np.ndarray) -> float:
    return float(x.var(ddof=1) / x.size)


def welch(sample: Sequence[float], baseline: Sequence[float]) -> Welch | str:
    """Welch's test (scipy.stats.ttest_ind, equal_var=False), or the reason it cannot be done."""
    from scipy import stats

    x, y = np.asarray(sample, dtype=float), np.asarray(baseline, dtype=float)
    if x.size < 2 or y.size < 2:
        return f"needs 2+ seeds on both sides ({x.size} vs {y.size})"
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        return "non-finite final loss"
    vx, vy = _variance(x), _variance(y)
    if vx + vy == 0:
        return "no variance on either side"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.ttest_ind(x, y, equal_var=False)
    return Welch(
        t=float(res.statistic), df=satterthwaite(vx, vy, x.size - 1, y.size - 1), p=float(res.pvalue)
    )


def satterthwaite(v1: float, v2: float, df1: float, df2: float) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of two variance estimates (also res.df on
    scipy >= 1.11)."""
    return (v1 + v2) ** 2 / (v1**2 / df1 + v2**2 / df2)


# ----------------------------------------------------------------------------- power


@dataclass(frozen=True)
class Spread:
    """The seed-to-seed variance a comparison sees: of the per-seed differences (paired), or of the
    group's and the baseline's final values (Welch). It gives the standard error of the difference
    in means and its degrees of freedom for any number of seeds."""

    paired: bool
    var: float  # paired: the variance of the differences; Welch: the group's variance
    var_baseline: float = 0.0  # Welch only

    def se_df(self, n: int, n_baseline: int | None = None) -> tuple[float, float]:
        """(standard error, degrees of freedom) with n seeds (pairs), n_baseline on the other side."""
        if self.paired:
            return math.sqrt(self.var / n), n - 1.0
        nb = n if n_baseline is None else n_baseline
        vg, vb = self.var / n, self.var_baseline / nb
        if vg + vb == 0:
            return 0.0, math.inf
        return math.sqrt(vg + vb), satterthwaite(vg, vb, n - 1, nb - 1)


def power(difference: float, se: float, df: float, alpha: float = ALPHA) -> float:
    """The chance that a two-sided t-test at `alpha` rejects when the true difference is `difference`
    and its estimate has standard error `se` with `df` degrees of freedom: the statistic then follows
    a noncentral t distribution with noncentrality difference / se."""
    from scipy import stats

    if se == 0:
        return 1.0 if difference != 0 else alpha
    crit = stats.t.ppf(1 - alpha / 2, df)
    ncp = abs(difference) / se
    upper = float(stats.nct.sf(crit, df, ncp))
    if not math.isfinite(upper):
        upper = 1.0 - float(stats.nct.cdf(crit, df, ncp))
    lower = float(stats.nct.sf(crit, df, -ncp))  # P(T < -crit) by symmetry; scipy's cdf there can be nan
    return upper + (lower if math.isfinite(lower) else 0.0)


def detectable_difference(se: float, df: float, power_: float = POWER, alpha: float = ALPHA) -> float:
    """The smallest true |difference| that the test detects with probability `power_`: k * se, where
    the noncentrality k solves power(k * se) = power_ (about 2.80 for many degrees of freedom)."""
    from scipy.optimize import brentq

    if se == 0:
        return 0.0
    hi = 4.0
    while power(hi, 1.0, df, alpha) < power_:
        hi *= 2
    return float(brentq(lambda k: power(k, 1.0, df, alpha) - power_, 0.0, hi, xtol=1e-10)) * se


def seeds_needed(
    difference: float, spread: Spread, power_: float = POWER, alpha: float = ALPHA
) -> int | None:
    """The fewest seeds per side (pairs, when paired) for which a true difference equal to the one
    observed would be detected with probability `power_`, if the seeds keep scattering as observed.
    None when the observed difference is 0 (no number of seeds) or more than MAX_SEEDS are needed."""
    if difference == 0 or not math.isfinite(difference):
        return None

    def enough(n: int) -> bool:
        return power(difference, *spread.se_df(n), alpha) >= power_

    hi = 2
    while not enough(hi):
        if hi >= MAX_SEEDS:
            return None
        hi = min(2 * hi, MAX_SEEDS)
    lo = hi // 2  # not enough (or below 2)
    while hi - lo > 1:  # power grows with n
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid, hi)
    return max(hi, 2)


# ----------------------------------------------------------------------------- comparisons


@dataclass
class Comparison:
    """A group's final values against the baseline's: the test used and what its seeds could detect."""

    test: str  # "paired" or "Welch"
    n: int  # pairs (paired) or the group's seeds
    n_baseline: int
    difference: float  # mean(group) - mean(baseline); paired: the mean of the per-seed differences
    se: float
    df: float
    t: float
    p: float  # two-sided, uncorrected
    ci: tuple[float, float]  # LEVEL confidence interval of the difference
    detectable: float  # smallest |difference| found with POWER at ALPHA with these seeds and this spread
    seeds_needed: int | None  # seeds per side for POWER at the observed difference
    spread: Spread
    differences: list[float] = field(default_factory=list)  # per seed, in the baseline's order (paired)
    p_holm: float | None = None  # set by the report: Holm-adjusted over all comparisons with the baseline

    @property
    def significant(self) -> bool:
        return (self.p if self.p_holm is None else self.p_holm) < ALPHA


def compare(sample: Sequence[float], baseline: Sequence[float], paired: bool) -> Comparison | str:
    """The paired t-test (scipy.stats.ttest_rel; sample[i] and baseline[i] share a seed) or Welch's
    test of sample against baseline, or the reason neither can be done."""
    from scipy import stats

    x, y = np.asarray(sample, dtype=float), np.asarray(baseline, dtype=float)
    if not paired:
        res = welch(x, y)
        if isinstance(res, str):
            return res
        spread = Spread(False, float(x.var(ddof=1)), float(y.var(ddof=1)))
        se, df = spread.se_df(x.size, y.size)
        diff, t, p, differences = float(x.mean() - y.mean()), res.t, res.p, []
    else:
        if x.size != y.size:
            raise ValueError("a paired comparison needs as many runs on both sides")
        if x.size < 2:
            return f"needs 2+ paired seeds ({x.size})"
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            return "non-finite final loss"
        d = x - y
        if d.var(ddof=1) == 0:
            return "the per-seed differences are all equal (no spread to test against)"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = stats.ttest_rel(x, y)
        spread = Spread(True, float(d.var(ddof=1)))
        se, df = spread.se_df(d.size)
        diff, t, p, differences = float(d.mean()), float(res.statistic), float(res.pvalue), d.tolist()
    half = float(stats.t.ppf(0.5 + LEVEL / 2, df)) * se
    return Comparison(
        test="paired" if paired else "Welch",
        n=int(x.size),
        n_baseline=int(y.size),
        difference=diff,
        se=se,
        df=df,
        t=t,
        p=p,
        ci=(diff - half, diff + half),
        detectable=detectable_difference(se, df),
        seeds_needed=seeds_needed(diff, spread),
        spread=spread,
        differences=differences,
    )


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: sort the m p-values, multiply the k-th
    smallest by m - k + 1, carry the running maximum forward, cap at 1. Rejecting where the adjusted
    p < alpha keeps the chance of any false rejection among the m at most alpha."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * pvalues[i]))
        adjusted[i] = running
    return adjusted
