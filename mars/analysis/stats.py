"""Curve statistics of a report: seed means, tokens to a target value, the L(D) data-scaling fit.

All curves are lists of (tokens, value) points; non-finite values (a diverged evaluation) are
skipped wherever a curve is interpolated or fitted, but kept in final-value statistics, where a
diverged run must show up as nan rather than vanish. Tests and intervals: mars.analysis.significance
and mars.analysis.intervals.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Points = Sequence[tuple[float, float]]  # one curve: its (tokens, value) points (a run is analysis.runs.Run)


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (ddof=1); the std is None for a single value."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return math.nan, None
    return float(arr.mean()), (float(arr.std(ddof=1)) if arr.size > 1 else None)


def finite_points(curve: Points) -> list[tuple[float, float]]:
    """The finite points of a curve, sorted by tokens; a repeated token count keeps its last value."""
    by_tokens: dict[float, float] = {}
    for d, loss in curve:
        if math.isfinite(d) and math.isfinite(loss):
            by_tokens[float(d)] = float(loss)
    return sorted(by_tokens.items())


def tokens_to_target(curve: Points, target: float, higher_is_better: bool = False) -> float | None:
    """Tokens at which the curve first reaches the target (value <= target, or >= for a metric where
    higher is better), None if it never does.

    Between two evaluations the value is taken as linear in tokens, so the crossing is interpolated
    rather than rounded up to the next evaluation: with evaluations every N tokens, rounding would
    blur speedups by up to N tokens.
    """
    prev: tuple[float, float] | None = None
    for d, loss in finite_points(curve):
        if (loss >= target) if higher_is_better else (loss <= target):
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


def mean_curve(curves: Sequence[Points]) -> Band | None:
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
B_MIN, B_MAX = 1e-4, 5.0  # the exponent's range; a fit that ends on either bound is refused
N_PARAMETERS = 3  # a, b, c: the fewest points a fit can be asked of (mars.analysis.scaling passes it)


def fit_power_law(
    curve: Points,
    min_points: int = MIN_FIT_POINTS,
    what: str = "the baseline",
    x_name: str = "tokens",
    points: str = "evaluations",
) -> PowerLaw:
    """Least-squares fit of L(D) = a D^-b + c to the points with D > 0 (scipy's curve_fit). D is any
    positive size: training tokens (the report's curves, the study's budgets) or parameters.

    Tokens are divided by the largest D first so the three parameters are of similar size. The
    start values come from a grid over b, where for each b the best (a, c) is a linear least
    squares problem; curve_fit then refines all three within a > 0, B_MIN <= b <= B_MAX and
    0 <= c <= min(L) (the loss never drops below its own asymptote). A b that ends on either bound
    is refused (FitError): the points follow no such power law in this range.
    """
    from scipy.optimize import curve_fit

    pts = [(d, v) for d, v in finite_points(curve) if d > 0]
    if len(pts) < min_points:
        raise FitError(f"needs at least {min_points} {points} with {x_name} > 0, {what} has {len(pts)}")
    d = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    if y.min() <= 0:
        raise FitError("losses must be positive")
    scale = d.max()
    u = d / scale
    c_max = float(y.min())

    def model(u, a, b, c):
        return a * np.power(u, -b) + c

    # all grid values of b at once: per b, (a, c) is the least-squares line of y on x = u^-b
    bs = np.geomspace(1e-3, B_MAX, 200)
    x = np.power(u[None, :], -bs[:, None])
    xc = x - x.mean(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        a_all = (xc @ (y - y.mean())) / np.einsum("ij,ij->i", xc, xc)
        c_all = np.clip(y.mean() - a_all * x.mean(axis=1), 0.0, c_max)
        sse = np.sum((a_all[:, None] * x + c_all[:, None] - y) ** 2, axis=1)
    sse[~(a_all > 0) | ~np.isfinite(sse)] = np.inf
    if not np.isfinite(sse).any():
        raise FitError(f"{what}'s loss does not fall as {x_name} grow")
    k = int(np.argmin(sse))
    a0, b0, c0 = float(a_all[k]), float(bs[k]), float(c_all[k])
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
                bounds=([0.0, B_MIN, 0.0], [np.inf, B_MAX, c_max]),
                ftol=1e-14,
                xtol=1e-14,
                gtol=1e-14,
                max_nfev=20000,
            )
    except (RuntimeError, ValueError) as e:
        raise FitError(f"curve_fit did not converge ({e})") from None
    if not all(map(math.isfinite, (a, b, c))):
        raise FitError("curve_fit returned non-finite parameters")
    for bound, shape in ((B_MAX, "a drop too steep"), (B_MIN, "next to no fall")):
        if math.isclose(b, bound, rel_tol=1e-6):  # the least squares wanted beyond it: no power law here
            raise FitError(
                f"the fit of {what} puts the exponent at its bound {bound:g} ({shape} for E + A "
                f"{x_name}^-alpha over these {points}): neither the fit nor an extrapolation is determined"
            )
    rmse = float(np.sqrt(np.mean((model(u, a, b, c) - y) ** 2)))
    return PowerLaw(
        a=float(a * scale**b), b=float(b), c=float(c), n_points=len(pts), rmse=rmse, max_tokens=float(scale)
    )
