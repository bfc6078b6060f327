"""The study's figures: each arm's metric against each searched key, and the sensitivity profiles.

* search_ARM.png: one panel per searched key, every search trial as a point (one marker per round),
  log axes where the key's range is log, the best trial marked, diverged trials as crosses on the top
  edge (bottom for metrics where higher is better), each round's range as dashed lines.
* sensitivity.png: one panel per key, one line per arm that searched it: the profile, i.e. the best
  trial in each of a few equal bins of the key's range (in the coordinate it was searched in). With
  the other keys free, the profile is what the arm reaches with that key fixed near a value, which is
  the curve Wen et al. (2025) draw for each hyperparameter around an optimizer's optimum, here read off
  the search instead of 1-D sweeps. How far it rises from its best across the range is the
  sensitivity (the report's table).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mars.analysis.plots import colors, legend_outside, pyplot, save
from mars.study.space import Dist

MARKERS = "osD^v<>ph"


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def search_figure(
    out: Path, arm: str, space: dict[str, Dist], rounds: Sequence[dict[str, Dist]], trials, metric
) -> list[Path]:
    """`trials`: TrialRecords of the arm's search; `rounds`: each round's full space."""
    plt = pyplot()
    keys = list(space)
    fig, axes = plt.subplots(
        1, max(1, len(keys)), figsize=(4.2 * max(1, len(keys)), 3.4), layout="constrained"
    )
    axes = np.atleast_1d(axes)
    done = [t for t in trials if t.state == "COMPLETE"]
    finite = _finite([t.value for t in done])
    lo_y, hi_y = (min(finite), max(finite)) if finite else (0.0, 1.0)
    edge_y = hi_y if not metric.higher_is_better else lo_y
    best = None
    if finite:
        pick = min if not metric.higher_is_better else max
        best = pick(
            (t for t in done if t.value is not None and math.isfinite(t.value)), key=lambda t: t.value
        )
    for ax, key in zip(axes, keys, strict=False):
        d = space[key]
        for r in sorted({t.round for t in done}):
            pts = [t for t in done if t.round == r]
            xs = [_x(t.params.get(key), d) for t in pts if t.value is not None and math.isfinite(t.value)]
            ys = [t.value for t in pts if t.value is not None and math.isfinite(t.value)]
            ax.scatter(xs, ys, s=22, marker=MARKERS[r % len(MARKERS)], label=f"round {r}" if r else "search")
            bad = [_x(t.params.get(key), d) for t in pts if t.value is None or not math.isfinite(t.value)]
            if bad:
                ax.scatter(bad, [edge_y] * len(bad), marker="x", color="red", s=30, label="diverged")
        if best is not None:
            ax.scatter(
                [_x(best.params.get(key), d)],
                [best.value],
                marker="*",
                s=180,
                color="black",
                zorder=5,
                label="best",
            )
        if d.numeric:
            for r, rs in enumerate(rounds):
                if key in rs:
                    for b in (rs[key].lo, rs[key].hi):
                        ax.axvline(b, color="grey", lw=0.8, ls="--" if r else ":", alpha=0.7)
            if d.log:
                ax.set_xscale("log")
        ax.set_xlabel(key + (" (log)" if d.log else ""))
        ax.set_ylabel(metric.axis_label)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{arm}: {metric.key} of each search trial")
    legend_outside(fig, list(axes))
    return save(fig, out)


def _x(value, d: Dist):
    return value if d.numeric else str(value)


def profile(trials, key: str, d: Dist, higher_is_better: bool, bins: int) -> list[tuple[float, float, int]]:
    """(bin centre, best finite value in the bin, trials in the bin) over d's range, bins with trials only."""
    if not d.numeric:
        return []
    rng = d.range()
    edges = np.linspace(0.0, 1.0, bins + 1)
    out = []
    for i in range(bins):
        inside = []
        for t in trials:
            x = t.params.get(key)
            if t.state != "COMPLETE" or not isinstance(x, (int, float)):
                continue
            p = rng.position(float(x))
            if edges[i] <= p < edges[i + 1] or (i == bins - 1 and p == 1.0):
                inside.append(t)
        vals = _finite([t.value for t in inside])
        if not inside:
            continue
        best = (max if higher_is_better else min)(vals) if vals else math.nan
        c = (edges[i] + edges[i + 1]) / 2
        a, b = rng.coordinate(rng.lo), rng.coordinate(rng.hi)
        centre = math.exp(a + c * (b - a)) if rng.log else a + c * (b - a)
        out.append((centre, best, len(inside)))
    return out


def bins_for(n: int) -> int:
    return max(2, min(6, n // 3))


def sensitivity_figure(out: Path, arms: dict, metric) -> list[Path]:
    """`arms`: name -> (its final space, its search trials)."""
    plt = pyplot()
    keys = sorted({k for space, _ in arms.values() for k, d in space.items() if d.numeric})
    if not keys:
        return []
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4), layout="constrained")
    axes = np.atleast_1d(axes)
    palette = dict(zip(arms, colors(len(arms)), strict=True))
    for ax, key in zip(axes, keys, strict=True):
        log = False
        for arm, (space, trials) in arms.items():
            if key not in space:
                continue
            d = space[key]
            log = log or d.log
            prof = profile(trials, key, d, metric.higher_is_better, bins_for(len(trials)))
            xs = [c for c, v, _ in prof if math.isfinite(v)]
            ys = [v for _, v, _ in prof if math.isfinite(v)]
            ax.plot(xs, ys, marker="o", color=palette[arm], label=arm)
        if log:
            ax.set_xscale("log")
        ax.set_xlabel(key + (" (log)" if log else ""))
        ax.set_ylabel(f"best {metric.title} in the bin")
        ax.grid(alpha=0.3)
    fig.suptitle("Sensitivity: the best trial in each bin of the key's range")
    legend_outside(fig, list(axes))
    return save(fig, out)
