"""Is a tuned optimum bracketed by what was searched? The check behind "not at the optimum".

A comparison of optimizers means something only at each one's tuned optimum. A best setting is known
to be an optimum along a key only when the search went past it on both sides and found worse: the
rule, for each searched numeric key of one arm (one optimizer's search):

* the best point (by the metric's direction; diverged points, non-finite, rank worst) is bracketed
  on a side (lower / upper) when some point beyond it on that side, along the key, is worse than it
  by more than `tolerance` (in the metric's units; default 0); a diverged point beyond it is worse;
* a side that is not bracketed is an edge: no point lies beyond the best there (it is the lowest or
  highest value tried, whatever the range's bound), or every point there is within `tolerance` of
  it (the metric is flat towards that bound). The optimum may lie beyond: widen the range there.

So a metric that falls monotonically over the whole range is an edge however few points were
tried, and an interior optimum with a worse point on each side is not. A key with no effect puts
its best point at the extreme of its values now and then (2 of n points are extremes); `tolerance`
at the seed-to-seed spread keeps such noise from firing, as it keeps noise from bracketing.

mars.study runs it after each arm's search (auto_extend widens the range at each edge, and the
study report's sensitivity table shows each side's nearest bracketing point, the same function);
``scripts/report.py --edges`` runs it on ordinary sweeps, taking each optimizer's runs as one arm,
the keys that vary among its settings as the searched keys, and the values swept as the range.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

BOUNDS = ("lower", "upper")


@dataclass(frozen=True)
class Range:
    """A searched interval of a numeric key, in the coordinate it was searched in."""

    lo: float
    hi: float
    log: bool = False

    def coordinate(self, x: float) -> float:
        return math.log(x) if self.log else float(x)

    def position(self, x: float) -> float:
        """0 at lo, 1 at hi (linear in log(x) for a log range)."""
        a, b = self.coordinate(self.lo), self.coordinate(self.hi)
        return 0.5 if b == a else (self.coordinate(x) - a) / (b - a)


@dataclass(frozen=True)
class Side:
    """What lies beyond the best point along one key, on one side."""

    bound: str  # "lower" | "upper"
    beyond: int  # points beyond the best on this side (any value)
    nearest: float | None  # the key's value of the nearest point beyond that is worse by > tolerance
    worse_by: float  # how much worse that point is (inf: diverged); nan when there is none

    @property
    def bracketed(self) -> bool:
        return self.nearest is not None


@dataclass(frozen=True)
class Edge:
    """The best point of an arm is not bracketed on one side of one searched key."""

    arm: str
    key: str
    bound: str  # "lower" | "upper"
    value: float  # the range's bound on that side
    best: float  # the best point's value of the key
    beyond: int  # points beyond the best on that side (all within the tolerance of it)
    tolerance: float = 0.0

    def line(self) -> str:
        beyond, side = ("lower", "below") if self.bound == "lower" else ("higher", "above")
        bound = f"the range's {self.bound} bound: {self.value:.4g}"
        if self.beyond:
            where = (
                f"the {self.beyond} trial(s) {side} the best {self.key} found, {self.best:.4g}, are within "
                f"the tolerance ({self.tolerance:g}) of it ({bound})"
            )
        elif math.isclose(self.best, self.value, rel_tol=1e-9, abs_tol=0.0):
            where = (
                f"the best {self.key} found, {self.best:.4g}, sits at the {self.bound} bound of its range "
                f"({self.value:.4g})"
            )
        else:
            extreme = "lowest" if side == "below" else "highest"
            where = f"the best {self.key} found, {self.best:.4g}, is the {extreme} tried ({bound})"
        return f"{self.arm}: {where}; its optimum may lie {beyond}: widen the range"


def worst(higher_is_better: bool) -> float:
    return -math.inf if higher_is_better else math.inf


def _score(value: float, higher_is_better: bool) -> float:
    """Lower is better; non-finite values rank worst."""
    if not math.isfinite(value):
        return math.inf
    return -value if higher_is_better else value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def best_point(points: Sequence[tuple[dict[str, Any], float]], higher_is_better: bool = False):
    """(params, score) of the best point (score: lower is better), or None when none is finite."""
    scored = [(params, _score(value, higher_is_better)) for params, value in points]
    finite = [(params, s) for params, s in scored if math.isfinite(s)]
    return min(finite, key=lambda ps: ps[1]) if finite else None


def sides(
    points: Sequence[tuple[dict[str, Any], float]],
    key: str,
    higher_is_better: bool = False,
    tolerance: float = 0.0,
) -> tuple[Side, Side] | None:
    """The lower and upper Side of the best point along `key` (None: no finite point, or the best has
    no numeric value of the key)."""
    best = best_point(points, higher_is_better)
    if best is None or not _number(best[0].get(key)):
        return None
    best_params, best_score = best
    x = float(best_params[key])
    out = []
    for bound in BOUNDS:
        beyond = [
            (float(params[key]), _score(value, higher_is_better) - best_score)
            for params, value in points
            if _number(params.get(key)) and (params[key] < x if bound == "lower" else params[key] > x)
        ]
        worse = [(v, d) for v, d in beyond if d > tolerance]
        if worse:
            v, d = min(worse, key=lambda vd: abs(vd[0] - x))
            out.append(Side(bound, len(beyond), v, d))
        else:
            out.append(Side(bound, len(beyond), None, math.nan))
    return out[0], out[1]


def find_edges(
    points: Sequence[tuple[dict[str, Any], float]],
    ranges: dict[str, Range],
    higher_is_better: bool = False,
    tolerance: float = 0.0,
    arm: str = "",
) -> list[Edge]:
    """The edges of one arm: `points` are (the point's value of each key, its metric)."""
    edges = []
    for key, rng in ranges.items():
        if rng.hi <= rng.lo:
            continue
        found = sides(points, key, higher_is_better, tolerance)
        if found is None:
            continue
        best = best_point(points, higher_is_better)[0][key]
        for side in found:
            if not side.bracketed:
                value = rng.lo if side.bound == "lower" else rng.hi
                edges.append(Edge(arm, key, side.bound, float(value), float(best), side.beyond, tolerance))
    return edges


def swept_range(values: Sequence[float]) -> Range:
    return Range(min(values), max(values))


# ----------------------------------------------------------------------------- ordinary sweeps


def sweep_edges(runs, metric, tolerance: float = 0.0) -> tuple[list[Edge], list[str]]:
    """The edge check on the runs of ordinary sweeps: each optimizer's settings are one arm, the numeric
    keys that vary among them the searched keys, a setting's value the mean final metric over its
    seeds. Returns the edges and one line per arm and key saying what was checked."""
    from mars.analysis.groups import group_runs
    from mars.analysis.labels import format_value, optimizer_title

    arms: dict[str, list] = {}
    for group in group_runs(runs):
        arms.setdefault(optimizer_title(group.settings), []).append(group)
    edges: list[Edge] = []
    checked: list[str] = []
    for arm, groups in arms.items():
        keys = sorted(
            k
            for k in {k for g in groups for k in g.settings}
            if all(_number(g.settings.get(k)) for g in groups)
            and len({g.settings.get(k) for g in groups}) > 1
        )
        points = []
        for g in groups:
            finals = [r.final(metric.key) for r in g.runs]
            value = sum(finals) / len(finals) if all(math.isfinite(v) for v in finals) else math.nan
            points.append(({k: g.settings.get(k) for k in keys}, value))
        ranges = {k: swept_range([float(g.settings[k]) for g in groups]) for k in keys}
        edges += find_edges(points, ranges, metric.higher_is_better, tolerance, arm)
        for k in ranges:
            values = sorted({float(g.settings[k]) for g in groups})
            checked.append(f"{arm}: {k} swept over {', '.join(format_value(v) for v in values)}")
    return edges, checked
