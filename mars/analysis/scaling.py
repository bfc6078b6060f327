"""How a difference between optimizers moves with data and model size: fits of final losses over budgets
and sizes, the effective-data speedup as a function of D, and the budget table.

The input is a table of final losses, `Finals`: {x: {seed: loss}} for one arm at one size, where x is
the training tokens of a budget (or, for a size ladder, the model's parameters at one budget). One fit
code for everything (mars.analysis.stats.fit_power_law, as the report's L(D) fit):

    L(x) = E + A * x^-alpha           fitted to the seed-mean loss at each x

* loss against tokens, per arm and size: x = the tokens a budget trains;
* loss against size, per arm and budget: x = non-embedding parameters (the embeddings are a lookup,
  not compute, and at CPU scale they would dominate the count: mars.model's num_params);
* the effective-data speedup of an arm at D: the tokens the baseline's fitted curve needs to reach the
  arm's fitted loss at D, divided by D (>1: the arm gets there with less data). Beyond the largest
  measured budget it is an extrapolation of both fits; `extrapolation` says by how much (D over the
  largest budget), and the report and plots state that factor next to every extrapolated value.

Intervals are the report's (mars.analysis.intervals): the jackknife over seeds, paired (the arms ran the
same seeds, and a seed leaves both together), on the log scale with Student's t, every fit redone per
left-out seed. Not a bootstrap: with three seeds a bootstrap reshuffles three numbers, and its
percentile interval is too narrow (intervals.py works it through). With 3 budgets the fit has as many
points as parameters and goes through them exactly: the interval then holds only the seeds' spread, not
the model's misfit, which nothing can measure with 3 points.

A fit that cannot be made (fewer points than parameters, a loss that does not fall, no convergence)
comes back as a one-line reason (a str), never an exception, so the report says it and goes on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mars.analysis.intervals import Interval, jackknife_interval
from mars.analysis.significance import compare, holm
from mars.analysis.stats import N_PARAMETERS, FitError, PowerLaw, fit_power_law, mean_std

Finals = dict[float, dict[int, float]]  # x (tokens, or parameters) -> {seed: final loss}
EXTRAPOLATE = 4.0  # how far past the largest budget the speedup is drawn, as a factor of D


def common_seeds(*tables: Finals) -> list[int]:
    """The seeds every x of every table has (the pairing)."""
    sets = [set(seeds) for t in tables for seeds in t.values()]
    return sorted(set.intersection(*sets)) if sets else []


def means(finals: Finals, seeds: Sequence[int]) -> list[tuple[float, float]]:
    """(x, the mean loss over `seeds`) for each x, sorted; an x that lacks one of them is left out."""
    return sorted(
        (float(x), float(np.mean([by_seed[s] for s in seeds])))
        for x, by_seed in finals.items()
        if seeds and all(s in by_seed for s in seeds)
    )


def fit(finals: Finals, seeds: Sequence[int], what: str = "the arm", x: str = "tokens") -> PowerLaw | str:
    """L(x) = E + A x^-alpha through the seed means (PowerLaw: a = A, b = alpha, c = E), or why not."""
    pts = means(finals, seeds)
    if any(not math.isfinite(v) for _, v in pts):
        return f"{what} has a non-finite final loss (a diverged run)"
    try:
        return fit_power_law(pts, min_points=N_PARAMETERS, what=what, x_name=x, points="points")
    except FitError as e:
        return str(e)


def parameter_intervals(
    finals: Finals, seeds: Sequence[int], what: str = "the arm"
) -> dict[str, Interval | str]:
    """Jackknife intervals over seeds for E, A and alpha (each positive: on the log scale)."""
    seeds = list(seeds)
    cache: dict[tuple[int, ...], PowerLaw | str] = {}

    def fitted(keep: list[int]) -> PowerLaw | str:
        key = tuple(keep)
        if key not in cache:
            cache[key] = fit(finals, [seeds[i] for i in keep], what)
        return cache[key]

    def one(attr: str):
        def estimate(keep, _):
            f = fitted(keep)
            return f if isinstance(f, str) else float(getattr(f, attr))

        return jackknife_interval(estimate, len(seeds), len(seeds), paired=True)

    return {"E": one("c"), "A": one("a"), "alpha": one("b")}


def speedup_at(base: PowerLaw, arm: PowerLaw, d: float) -> float | str:
    """The effective-data speedup at D: L_base^-1(L_arm(D)) / D, or why there is none."""
    target = float(arm.loss(d))
    needed = base.tokens_for(target)
    if needed is None:
        return f"the arm's loss at D ({target:.4g}) lies below the baseline's fitted floor E ({base.c:.4g})"
    return needed / d


@dataclass
class SpeedupPoint:
    d: float  # tokens (or the x of the fits)
    value: float | None
    interval: Interval | str
    extrapolation: float  # d / the largest x both fits saw (> 1: beyond the measured range)
    why: str = ""  # why there is no value

    @property
    def extrapolated(self) -> bool:
        return self.extrapolation > 1.0 + 1e-9


def extrapolation_label(factor: float) -> str:
    """ "x4 beyond the largest budget", or "" inside the measured range."""
    return f"x{factor:.3g} beyond the largest budget" if factor > 1.0 + 1e-9 else ""


class SpeedupFits:
    """The effective-data speedup of one arm over the baseline (one size), as a function of D and of the
    seeds used, so that point estimates and the jackknife's leave-one-seed-out values are one computation.
    """

    def __init__(self, arm: Finals, base: Finals, arm_name: str = "the arm", base_name: str = "the baseline"):
        self.arm, self.base = arm, base
        self.names = (arm_name, base_name)
        self.seeds = common_seeds(arm, base)
        self._fits: dict[tuple, tuple[PowerLaw | str, PowerLaw | str]] = {}
        xs = [x for x in arm if x in base]
        self.largest = float(max(xs)) if xs else math.nan

    def fits(self, keep: Sequence[int]) -> tuple[PowerLaw | str, PowerLaw | str]:
        key = tuple(keep)
        if key not in self._fits:
            seeds = [self.seeds[i] for i in keep]
            self._fits[key] = (fit(self.arm, seeds, self.names[0]), fit(self.base, seeds, self.names[1]))
        return self._fits[key]

    def estimate(self, d: float, keep: Sequence[int]) -> float | str:
        arm, base = self.fits(keep)
        if isinstance(arm, str) or isinstance(base, str):
            return arm if isinstance(arm, str) else base
        return speedup_at(base, arm, d)

    def at(self, d: float) -> SpeedupPoint:
        n = len(self.seeds)
        if n == 0:
            return SpeedupPoint(d, None, "no seed both arms ran", d / self.largest, "no seed both arms ran")
        value = self.estimate(d, list(range(n)))
        interval = jackknife_interval(lambda keep, _: self.estimate(d, keep), n, n, paired=True)
        if isinstance(value, str):
            return SpeedupPoint(d, None, interval, d / self.largest, value)
        return SpeedupPoint(d, float(value), interval, d / self.largest)

    def curve(self, lo: float, hi: float, n: int = 40) -> list[SpeedupPoint]:
        return [self.at(float(d)) for d in np.geomspace(lo, hi, n)]


# ----------------------------------------------------------------------------- the budget table


@dataclass
class BudgetRow:
    arm: str
    size: str
    tokens: float
    steps: int
    mean: float
    std: float | None
    n: int
    comparison: object = None  # mars.analysis.significance.Comparison, its reason (str), or None (baseline)
    p_holm: float | None = None


def budget_table(
    cells: dict[tuple[str, str, int], dict[int, float]],
    tokens_per_step: dict[str, int],
    baseline: str,
    order: list[str] | None = None,
) -> list[BudgetRow]:
    """Arm x size x budget: mean +- std over seeds and, for every arm but the baseline, the paired
    comparison with the baseline at the same size and budget on the seeds both ran; Holm over all the
    table's comparisons (one family: every budget and size is a look at the same question).
    `cells`: (arm, size, steps) -> {seed: final loss}; `tokens_per_step`: size -> tokens of one step; rows
    by size (in `order`, else as first seen), budget, then arm."""
    rows = []
    sizes, arms = list(dict.fromkeys(z for _, z, _ in cells)), list(dict.fromkeys(a for a, _, _ in cells))
    if order is not None:
        sizes = [z for z in order if z in sizes] + [z for z in sizes if z not in order]
    for (arm, size, steps), by_seed in sorted(
        cells.items(), key=lambda kv: (sizes.index(kv[0][1]), kv[0][2], arms.index(kv[0][0]))
    ):
        values = [by_seed[s] for s in sorted(by_seed)]
        mean, std = mean_std(values)
        row = BudgetRow(arm, size, steps * tokens_per_step[size], steps, mean, std, len(values))
        base = cells.get((baseline, size, steps))
        if arm != baseline:
            if base is None:
                row.comparison = f"the baseline {baseline} has no run at this size and budget"
            else:
                seeds = sorted(set(by_seed) & set(base))
                row.comparison = compare([by_seed[s] for s in seeds], [base[s] for s in seeds], paired=True)
        rows.append(row)
    tested = [r for r in rows if r.comparison is not None and not isinstance(r.comparison, str)]
    for r, p in zip(tested, holm([r.comparison.p for r in tested]), strict=True):
        r.p_holm = p
    return rows


# ----------------------------------------------------------------------------- a whole ladder


@dataclass(frozen=True)
class SizeInfo:
    name: str
    tokens_per_step: int
    params: int  # non-embedding


@dataclass
class Ladder:
    """The finals of a study with budgets and sizes: (arm, size, steps) -> {seed: final loss}."""

    cells: dict[tuple[str, str, int], dict[int, float]]
    sizes: list[SizeInfo]  # smallest first
    arms: list[str]
    baseline: str

    def finals(self, arm: str, size: SizeInfo) -> Finals:
        """{tokens: {seed: loss}} of one arm at one size."""
        return {
            float(steps * size.tokens_per_step): dict(v)
            for (a, z, steps), v in self.cells.items()
            if a == arm and z == size.name
        }

    def at_budget(self, arm: str, steps: int) -> Finals:
        """{parameters: {seed: loss}} of one arm at one budget in steps, over the sizes."""
        return {float(z.params): dict(self.cells[(arm, z.name, steps)]) for z in self.sizes
                if (arm, z.name, steps) in self.cells}  # fmt: skip

    @property
    def budgets(self) -> list[int]:
        return sorted({steps for _, _, steps in self.cells})


@dataclass
class Analysis:
    """Every fit of a ladder, each a value or the one-line reason it could not be made."""

    loss_fits: dict[tuple[str, str], PowerLaw | str]  # (arm, size) -> L(D)
    loss_intervals: dict[tuple[str, str], dict[str, Interval | str]]
    size_fits: dict[tuple[str, int], PowerLaw | str]  # (arm, steps) -> L(N), N non-embedding params
    speedups: dict[tuple[str, str], list[SpeedupPoint]]  # (arm, size) -> at each measured budget
    speedup_curves: dict[tuple[str, str], list[SpeedupPoint]]  # (arm, size) -> a grid to EXTRAPOLATE x
    extrapolate: float


def analyse(ladder: Ladder, extrapolate: float = EXTRAPOLATE, grid: int = 30) -> Analysis:
    loss_fits, loss_iv, size_fits, speedups, curves = {}, {}, {}, {}, {}
    for size in ladder.sizes:
        for arm in ladder.arms:
            finals = ladder.finals(arm, size)
            seeds = common_seeds(finals)
            what = f"{arm}{f' at size {size.name}' if size.name else ''}"
            loss_fits[(arm, size.name)] = fit(finals, seeds, what)
            loss_iv[(arm, size.name)] = parameter_intervals(finals, seeds, what)
            if arm == ladder.baseline:
                continue
            base = ladder.finals(ladder.baseline, size)
            sf = SpeedupFits(
                finals, base, what, f"{ladder.baseline}{f' at size {size.name}' if size.name else ''}"
            )
            measured = sorted(d for d in finals if d in base)
            if measured:
                speedups[(arm, size.name)] = [sf.at(d) for d in measured]
                curves[(arm, size.name)] = sf.curve(measured[0], extrapolate * measured[-1], grid)
    if len(ladder.sizes) > 1:
        for arm in ladder.arms:
            for steps in ladder.budgets:
                finals = ladder.at_budget(arm, steps)
                what = f"{arm} at {steps} steps"
                size_fits[(arm, steps)] = fit(finals, common_seeds(finals), what, x="parameters")
    return Analysis(loss_fits, loss_iv, size_fits, speedups, curves, extrapolate)
