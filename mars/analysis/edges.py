"""Is a tuned optimum at the edge of what was searched? The check behind "not at the optimum".

A comparison of optimizers means something only at each one's tuned optimum. When the best setting
found lies at a bound of a searched range, the optimum may lie beyond it, and the comparison is not
at the optimum. The rule, for each searched numeric key of one arm (one optimizer's search):

* positions are measured in the coordinate the key was searched in: log(value) for a log range,
  the value itself otherwise; 0 at the lower bound, 1 at the upper;
* the edge fires at a bound when the best point (by the metric's direction; diverged points,
  non-finite, rank worst) lies within `fraction` of the range next to that bound (default 0.1: the
  outer tenth), and beats every point outside that band by more than `tolerance` (in the metric's
  units; default 0). A key with no effect puts its best point in an outer tenth 20% of the time;
  `tolerance` at the seed-to-seed spread keeps such noise from firing.

mars.study runs it after each arm's search (and widens the range with auto_extend);
``scripts/report.py --edges`` runs it on ordinary sweeps, taking each optimizer's runs as one arm,
the keys that vary among its settings as the searched keys, and the values swept as the range (log
when they are positive and span a factor of 4 or more, as learning-rate grids do).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

FRACTION = 0.1
LOG_SPAN = 4.0  # a swept range of positive values spanning this factor is taken as log-spaced


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
class Edge:
    """The best point of an arm sits at a bound of one searched key."""

    arm: str
    key: str
    bound: str  # "lower" | "upper"
    value: float  # the bound
    best: float  # the best point's value of the key
    margin: float  # how much the best point beats the best one outside the band (inf: none outside)

    def line(self) -> str:
        beyond = "lower" if self.bound == "lower" else "higher"
        return (
            f"{self.arm}: the best {self.key} found, {self.best:.4g}, sits at the {self.bound} bound of "
            f"its range ({self.value:.4g}); its optimum may lie {beyond}: widen the range"
        )


def worst(higher_is_better: bool) -> float:
    return -math.inf if higher_is_better else math.inf


def _score(value: float, higher_is_better: bool) -> float:
    """Lower is better; non-finite values rank worst."""
    if not math.isfinite(value):
        return math.inf
    return -value if higher_is_better else value


def find_edges(
    points: Sequence[tuple[dict[str, Any], float]],
    ranges: dict[str, Range],
    higher_is_better: bool = False,
    fraction: float = FRACTION,
    tolerance: float = 0.0,
    arm: str = "",
) -> list[Edge]:
    """The edges of one arm: `points` are (the point's value of each key, its metric)."""
    scored = [(params, _score(value, higher_is_better)) for params, value in points]
    finite = [(params, s) for params, s in scored if math.isfinite(s)]
    if not finite:
        return []
    best_params, best_score = min(finite, key=lambda ps: ps[1])
    edges = []
    for key, rng in ranges.items():
        x = best_params.get(key)
        if x is None or not isinstance(x, (int, float)) or rng.hi <= rng.lo:
            continue
        p = rng.position(float(x))
        for bound, inside in (("lower", p <= fraction), ("upper", p >= 1 - fraction)):
            if not inside:
                continue
            outside = [
                s
                for params, s in finite
                if isinstance(params.get(key), (int, float))
                and not _in_band(rng.position(float(params[key])), bound, fraction)
            ]
            margin = (min(outside) - best_score) if outside else math.inf
            if margin > tolerance:
                edge_value = rng.lo if bound == "lower" else rng.hi
                edges.append(Edge(arm, key, bound, float(edge_value), float(x), margin))
    return edges


def _in_band(p: float, bound: str, fraction: float) -> bool:
    return p <= fraction if bound == "lower" else p >= 1 - fraction


def swept_range(values: Sequence[float]) -> Range:
    lo, hi = min(values), max(values)
    return Range(lo, hi, log=lo > 0 and hi / lo >= LOG_SPAN)


# ----------------------------------------------------------------------------- ordinary sweeps


def sweep_edges(
    runs, metric, fraction: float = FRACTION, tolerance: float = 0.0
) -> tuple[list[Edge], list[str]]:
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
        edges += find_edges(points, ranges, metric.higher_is_better, fraction, tolerance, arm)
        for k, rng in ranges.items():
            values = sorted({float(g.settings[k]) for g in groups})
            checked.append(
                f"{arm}: {k} swept over {', '.join(format_value(v) for v in values)} "
                f"({'log' if rng.log else 'linear'} positions)"
            )
    return edges, checked


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
