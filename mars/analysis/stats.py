"""The numbers of a report: seed statistics, tokens to a target loss, a data-scaling fit, Welch's test.

All curves are lists of (tokens, loss) points; non-finite losses (a diverged evaluation) are
skipped wherever a curve is interpolated or fitted, but kept in final-loss statistics, where a
diverged run must show up as nan rather than vanish.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Curve = Sequence[tuple[float, float]]


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (ddof=1); the std is None for a single value."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return math.nan, None
    return float(arr.mean()), (float(arr.std(ddof=1)) if arr.size > 1 else None)


def finite_points(curve: Curve) -> list[tuple[float, float]]:
    """The finite points of a curve, sorted by tokens; a repeated token count keeps its last value."""
    by_tokens: dict[float, float] = {}
    for d, loss in curve:
        if math.isfinite(d) and math.isfinite(loss):
            by_tokens[float(d)] = float(loss)
    return sorted(by_tokens.items())


def tokens_to_target(curve: Curve, target: float) -> float | None:
    """Tokens at which the curve first reaches the target (loss <= target), None if it never does.

    Between two evaluations the loss is taken as linear in tokens, so the crossing is interpolated
    rather than rounded up to the next evaluation: with evaluations every N tokens, rounding would
    blur speedups by up to N tokens.
    """
    prev: tuple[float, float] | None = None
    for d, loss in finite_points(curve):
        if loss <= target:
            if prev is None:
                return d
            d0, l0 = prev
            return d0 + (l0 - target) / (l0 - loss) * (d - d0)
        prev = (d, loss)
    return None


@dataclass
class Band:
    """Curves of several seeds on one token grid: their mean, min, max and sample std."""

    tokens: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    std: np.ndarray

    def points(self) -> list[tuple[float, float]]:
        return list(zip(self.tokens.tolist(), self.mean.tolist(), strict=True))


def mean_curve(curves: Sequence[Curve]) -> Band | None:
    """The seeds' curves averaged over the token range they all cover.

    The grid is the union of their evaluation points inside that range, each curve interpolated
    onto it; seeds of one setting normally share their evaluation points, and then this is a plain
    pointwise mean. None when the curves share no range.
    """
    pts = [finite_points(c) for c in curves]
    if not pts or any(not p for p in pts):
        return None
    lo, hi = max(p[0][0] for p in pts), min(p[-1][0] for p in pts)
    if lo > hi:
        return None
    grid = np.array(sorted({d for p in pts for d, _ in p if lo <= d <= hi}))
    ys = np.stack([np.interp(grid, [d for d, _ in p], [v for _, v in p]) for p in pts])
    std = ys.std(axis=0, ddof=1) if len(pts) > 1 else np.zeros_like(grid)
    return Band(grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0), std)


class FitError(ValueError):
    """The L(D) fit could not be made; the message says why."""


@dataclass
class PowerLaw:
    """L(D) = a * D^-b + c: loss against training tokens, c the loss that more data cannot remove."""

    a: float
    b: float
    c: float
    n_points: int
    rmse: float
    max_tokens: float  # the largest D the fit saw: beyond it, D_eff is an extrapolation

    def loss(self, tokens: float | np.ndarray) -> float | np.ndarray:
        return self.a * np.power(tokens, -self.b) + self.c

    def tokens_for(self, loss: float) -> float | None:
        """L^-1: the tokens the fitted curve needs to reach `loss`; None at or below the asymptote c."""
        if not math.isfinite(loss) or loss <= self.c:
            return None
        return float((self.a / (loss - self.c)) ** (1.0 / self.b))


MIN_FIT_POINTS = 4  # three parameters and at least one point to spare


def fit_power_law(curve: Curve) -> PowerLaw:
    """Least-squares fit of L(D) = a D^-b + c to the points with D > 0 (scipy's curve_fit).

    Tokens are divided by the largest D first so the three parameters are of similar size. The
    start values come from a grid over b, where for each b the best (a, c) is a linear least
    squares problem; curve_fit then refines all three within a > 0, 0 < b <= 5 and
    0 <= c <= min(L) (the loss never drops below its own asymptote).
    """
    from scipy.optimize import curve_fit

    pts = [(d, v) for d, v in finite_points(curve) if d > 0]
    if len(pts) < MIN_FIT_POINTS:
        raise FitError(
            f"needs at least {MIN_FIT_POINTS} evaluations with tokens > 0, the baseline has {len(pts)}"
        )
    d = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    if y.min() <= 0:
        raise FitError("losses must be positive")
    scale = d.max()
    u = d / scale
    c_max = float(y.min())

    def model(u, a, b, c):
        return a * np.power(u, -b) + c

    best = None
    for b in np.geomspace(1e-3, 5.0, 200):
        x = np.power(u, -b)
        (a, c), *_ = np.linalg.lstsq(np.stack([x, np.ones_like(x)], axis=1), y, rcond=None)
        if a <= 0:
            continue
        c = min(max(c, 0.0), c_max)
        sse = float(np.sum((a * x + c - y) ** 2))
        if best is None or sse < best[0]:
            best = (sse, a, b, c)
    if best is None:
        raise FitError("the baseline's val loss does not fall with tokens")
    _, a0, b0, c0 = best
    eps = 1e-9 * max(c_max, 1.0)
    c0 = min(max(c0, eps), c_max - eps)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (a, b, c), _ = curve_fit(
                model,
                u,
                y,
                p0=(a0, b0, c0),
                bounds=([0.0, 1e-4, 0.0], [np.inf, 5.0, c_max]),
                ftol=1e-14,
                xtol=1e-14,
                gtol=1e-14,
                max_nfev=20000,
            )
    except (RuntimeError, ValueError) as e:
        raise FitError(f"curve_fit did not converge ({e})") from None
    if not all(map(math.isfinite, (a, b, c))):
        raise FitError("curve_fit returned non-finite parameters")
    rmse = float(np.sqrt(np.mean((model(u, a, b, c) - y) ** 2)))
    return PowerLaw(
        a=float(a * scale**b), b=float(b), c=float(c), n_points=len(pts), rmse=rmse, max_tokens=float(scale)
    )


@dataclass
class Welch:
    """Welch's unequal-variance t-test of a group's final losses against the baseline's."""

    t: float
    df: float
    p: float  # two-sided

    @property
    def significant(self) -> bool:
        return self.p < 0.05


def welch(sample: Sequence[float], baseline: Sequence[float]) -> Welch | str:
    """Welch's test (scipy.stats.ttest_ind, equal_var=False), or the reason it cannot be done."""
    from scipy import stats

    x, y = np.asarray(sample, dtype=float), np.asarray(baseline, dtype=float)
    if x.size < 2 or y.size < 2:
        return f"needs 2+ seeds on both sides ({x.size} vs {y.size})"
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        return "non-finite final loss"
    vx, vy = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    if vx + vy == 0:
        return "no variance on either side"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = stats.ttest_ind(x, y, equal_var=False)
    # Welch-Satterthwaite degrees of freedom (also res.df on scipy >= 1.11)
    df = (vx + vy) ** 2 / (vx**2 / (x.size - 1) + vy**2 / (y.size - 1))
    return Welch(t=float(res.statistic), df=float(df), p=float(res.pvalue))
