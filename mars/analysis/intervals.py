"""Confidence intervals for the report's speedups: the jackknife over seeds, with Student's t.

A speedup is computed from all seeds of a group and of the baseline (their mean curves, the fit of
the baseline's mean curve). Leaving one seed out at a time and recomputing everything, target
included, shows how much the speedup moves with the seeds; on the log scale (a speedup is a ratio:
2x and 0.5x are equally far from 1x, and the interval stays positive)

    var = (n - 1) / n * sum_i (log S_(-i) - mean_j log S_(-j))^2

and the interval is exp(log S +- t_{df, 0.975} * sqrt(var)). Paired (the two groups ran the same
seeds): a seed leaves both sides together and df = n - 1, as in the paired t-test. Unpaired: each
side's seeds are left out in turn, the two variances add up and df is Welch-Satterthwaite's, as in
Welch's test. For the mean of the seeds this is exactly the t interval of the mean.

Why not a bootstrap over seeds: with three seeds a bootstrap can only reshuffle three numbers (10
distinct resamples), and its percentile interval for a mean is then exactly [lowest seed, highest
seed], which misses the true mean in 2 / 2^3 = 25% of experiments. The t quantile (4.30 with two
degrees of freedom rather than 1.96) is what makes three seeds honest. It is also deterministic.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mars.analysis.significance import LEVEL, satterthwaite

MAX_LOG = math.log(sys.float_info.max)
# (indices of the group's runs kept, indices of the baseline's runs kept) -> estimate, or why there is none
Estimate = Callable[[list[int], list[int]], "float | str"]


@dataclass
class Interval:
    low: float
    high: float
    level: float
    method: str  # "paired jackknife" or "jackknife"
    df: float


def _jackknife_var(values: list[float]) -> float:
    v = np.asarray(values)
    return float((v.size - 1) / v.size * np.sum((v - v.mean()) ** 2))


def _drop(n: int, i: int) -> list[int]:
    return [j for j in range(n) if j != i]


def jackknife_interval(
    estimate: Estimate, n: int, n_baseline: int, paired: bool, level: float = LEVEL
) -> Interval | str:
    """A `level` interval for a positive estimate (a speedup) from leave-one-seed-out estimates on
    the log scale, or the reason there is none. Paired: run i of the group and of the baseline share
    a seed and leave together (n == n_baseline)."""
    from scipy import stats

    full = estimate(list(range(n)), list(range(n_baseline)))
    if isinstance(full, str) or not full > 0:
        return "no estimate"

    def logs(cases: list[tuple[list[int], list[int]]]) -> list[float] | str:
        out = []
        for keep, keep_base in cases:
            value = estimate(keep, keep_base)
            if isinstance(value, str):
                return f"leaving one seed out: {value}"
            if not value > 0 or not math.isfinite(value):
                return "leaving one seed out: no positive estimate"
            out.append(math.log(value))
        return out

    if paired:
        if n != n_baseline:
            raise ValueError("a paired interval needs as many runs on both sides")
        if n < 2:
            return "needs 2+ paired seeds"
        values = logs([(_drop(n, i), _drop(n, i)) for i in range(n)])
        if isinstance(values, str):
            return values
        var, df, method = _jackknife_var(values), n - 1.0, "paired jackknife"
    else:
        if n < 2 or n_baseline < 2:
            return f"needs 2+ seeds on both sides ({n} vs {n_baseline})"
        mine = logs([(_drop(n, i), list(range(n_baseline))) for i in range(n)])
        theirs = logs([(list(range(n)), _drop(n_baseline, j)) for j in range(n_baseline)])
        if isinstance(mine, str) or isinstance(theirs, str):
            return mine if isinstance(mine, str) else theirs
        v1, v2 = _jackknife_var(mine), _jackknife_var(theirs)
        var, method = v1 + v2, "jackknife"
        df = satterthwaite(v1, v2, n - 1, n_baseline - 1) if var > 0 else math.inf
    half = float(stats.t.ppf(0.5 + level / 2, df)) * math.sqrt(var) if var > 0 else 0.0
    centre = math.log(full)
    high = math.exp(centre + half) if centre + half < MAX_LOG else math.inf  # a fit's wild seed: no overflow
    return Interval(math.exp(centre - half), high, level, method, df)
