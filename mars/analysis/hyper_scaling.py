"""How a hyperparameter's optimum moves with scale: a power law fitted to the optima a study's searches
found at each model size (and budget), its exponent's interval, and its prediction at a new size.

    h*(N)    = c N^b          fitted as   log h* = log c + b log N
    h*(N, D) = c N^a D^b      fitted as   log h* = log c + a log N + b log D

by ordinary least squares on the log scale, one point per searched size (and budget). N is the model's
non-embedding parameter count (as the ladder's L(N) in mars.analysis.scaling), D the tokens a budget
trains.

Each point is the best trial of a search, known only to the search's resolution: the true optimum lies
somewhere between the best trial and its nearest sampled neighbours in the key. `resolution` turns that
into a standard deviation on the log scale (uniform over the half-gaps on either side: width / sqrt(12)),
and a fit may take the points' root-mean-square of it as a floor on their scatter.

Intervals (95%, mars.analysis.significance.LEVEL) take the residuals' standard deviation s with Student's
t, df = points - parameters; where the floor is larger (or no degree of freedom is left), the floor with
the normal quantile (a known scatter):

* an exponent: b +- q s sqrt((X'X)^-1_bb). A key *moves with scale* when this interval excludes 0;
* a prediction at a new point x0 (a size left out of the fit): exp(x0'coef +- q s sqrt(1 + x0'(X'X)^-1 x0)),
  the interval of a new searched optimum there (the fit's uncertainty plus one search's scatter), which is
  what it is checked against.

Why the floor: with 3 or 4 sizes the residuals have 1 or 2 degrees of freedom, and searched optima that
happen to line up give an s far below the search's resolution (and an interval that misses the next
size's optimum). Not a bootstrap over sizes: with 3 or 4 sizes a bootstrap resamples 3 or 4 points, many
resamples hold one size alone (no slope), and its percentile interval is too narrow
(mars.analysis.intervals makes the same case for seeds). Without a floor and with as many points as
parameters (2 sizes for h*(N)) the fit passes through them: an estimate, no interval, and the functions
say so.

A fit that cannot be made comes back as a one-line reason (a str), never an exception, so the report
says it and goes on (as mars.analysis.scaling).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mars.analysis.significance import LEVEL

Point = tuple[Sequence[float], float]  # ((N,) or (N, D), the optimum there)


@dataclass
class Rule:
    """A fitted h*(x) = c prod_j x_j^b_j."""

    names: tuple[str, ...]  # the variables: ("N",) or ("N", "D")
    coef: np.ndarray  # log c, then one exponent per name
    xtx_inv: np.ndarray  # (X'X)^-1 of the log design
    s: float  # the residuals' standard deviation on the log scale (nan without degrees of freedom)
    df: int  # points - parameters
    floor: float = 0.0  # the points' scatter known from the search's resolution (log scale)

    @property
    def c(self) -> float:
        return math.exp(self.coef[0])

    @property
    def points(self) -> int:
        return self.df + len(self.coef)

    def exponent(self, name: str = "N") -> float:
        return float(self.coef[1 + self.names.index(name)])

    def _half(self, v: np.ndarray, new: float, level: float) -> float | str:
        """q s sqrt(new + v'(X'X)^-1 v), or why there is no interval."""
        from scipy import stats

        if self.df >= 1 and self.s >= self.floor:
            q, scale = float(stats.t.ppf(0.5 + level / 2, self.df)), self.s
        elif self.floor > 0:
            q, scale = float(stats.norm.ppf(0.5 + level / 2)), self.floor
        else:
            n, p = self.points, len(self.coef)
            return f"no interval: {n} points for {p} parameters, the fit passes through them"
        return q * scale * math.sqrt(new + float(v @ self.xtx_inv @ v))

    def exponent_interval(self, name: str = "N", level: float = LEVEL) -> tuple[float, float] | str:
        v = np.zeros(len(self.coef))
        v[1 + self.names.index(name)] = 1.0
        half = self._half(v, 0.0, level)
        b = self.exponent(name)
        return half if isinstance(half, str) else (b - half, b + half)

    def moves(self, name: str = "N", level: float = LEVEL) -> bool | None:
        """Whether the exponent's interval excludes 0 (None: no interval)."""
        iv = self.exponent_interval(name, level)
        return None if isinstance(iv, str) else not iv[0] <= 0.0 <= iv[1]

    def predict(self, x: Sequence[float]) -> float:
        return math.exp(float(self.coef @ _row(x)))

    def prediction_interval(self, x: Sequence[float], level: float = LEVEL) -> tuple[float, float] | str:
        """Where a new searched optimum at x falls (the fit's uncertainty and one search's scatter)."""
        v = _row(x)
        half = self._half(v, 1.0, level)
        if isinstance(half, str):
            return half
        centre = float(self.coef @ v)
        return math.exp(centre - half), math.exp(centre + half)

    def formula(self) -> str:
        """ "h*(N) = 0.031 N^-0.5" """
        powers = " ".join(f"{n}^{self.exponent(n):.3g}" for n in self.names)
        return f"h*({', '.join(self.names)}) = {self.c:.3g} {powers}"


def _row(x: Sequence[float]) -> np.ndarray:
    return np.array([1.0, *(math.log(float(v)) for v in x)])


def fit_rule(points: Sequence[Point], names: Sequence[str] = ("N",), floor: float = 0.0) -> Rule | str:
    """Least squares of log h* on log x over `points` (`floor`: their known scatter, log scale), or why
    there is no fit."""
    names = tuple(names)
    pts = [(tuple(float(v) for v in x), float(h)) for x, h in points]
    bad = [h for x, h in pts if not (math.isfinite(h) and h > 0) or any(not (v > 0) for v in x)]
    if bad:
        return f"an optimum of {bad[0]:.4g}: a power law needs positive values"
    p = 1 + len(names)
    if len(pts) < p:
        return f"needs at least {p} points for h*({', '.join(names)}), has {len(pts)}"
    X = np.array([_row(x) for x, _ in pts])
    y = np.log([h for _, h in pts])
    if np.linalg.matrix_rank(X) < p:
        return f"the points do not vary independently in {', '.join(names)}: the exponents are not determined"
    xtx_inv = np.linalg.inv(X.T @ X)
    coef = xtx_inv @ X.T @ y
    df = len(pts) - p
    s = math.sqrt(float(np.sum((y - X @ coef) ** 2)) / df) if df > 0 else math.nan
    return Rule(names, coef, xtx_inv, s, df, floor)


def resolution(best: float, sampled: Sequence[float]) -> float | None:
    """The standard deviation, on the log scale, of where the optimum lies given the best trial's value
    `best` and every value the search tried (`sampled`): uniform between the midpoints to its nearest
    neighbours (the gap on one side doubled where it has none on the other); None without a positive
    neighbour."""
    if not best > 0:
        return None
    logs = sorted({math.log(v) for v in sampled if v > 0})
    b = math.log(best)
    below, above = [b - x for x in logs if x < b], [x - b for x in logs if x > b]
    gaps = [min(below)] if below else []
    gaps += [min(above)] if above else []
    if not gaps:
        return None
    width = sum(gaps) / 2 if len(gaps) == 2 else gaps[0]
    return width / math.sqrt(12)


def floor_of(resolutions: Sequence[float | None]) -> float:
    """The root-mean-square of the points' resolutions (those known), 0 when none is."""
    known = [r for r in resolutions if r is not None]
    return math.sqrt(sum(r * r for r in known) / len(known)) if known else 0.0


@dataclass
class Check:
    """A rule's prediction at a point left out of its fit, against the optimum searched there."""

    predicted: float
    interval: tuple[float, float] | str
    searched: float

    @property
    def inside(self) -> bool | None:
        if isinstance(self.interval, str):
            return None
        return self.interval[0] <= self.searched <= self.interval[1]

    def verdict(self) -> str:
        return {True: "inside", False: "outside", None: "no interval"}[self.inside]


def check(rule: Rule, x: Sequence[float], searched: float, level: float = LEVEL) -> Check:
    return Check(rule.predict(x), rule.prediction_interval(x, level), float(searched))
