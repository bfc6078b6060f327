"""Time to a target value of the metric: per run and per setting, the steps, tokens and seconds it takes, a
one-sided test that a setting reaches the target, the comparison with the baseline, and the throughput
that turns a speedup in data into one in seconds.

* crossing, per run: where its curve first reaches the target (value <= target, or >= for a metric where
  higher is better), linear in steps between two evaluations: steps, tokens (steps x tokens per step) and
  seconds (train_time, the seconds spent in training steps, evaluations and compilation left out, logged
  on every evaluation line; linear between the two evaluations too). A fork's curve includes its parent's
  evaluations up to the fork. A run that never gets there has no crossing: "not reached", never a number.
* per setting: the median over its seeds (AlgoPerf's rule: a seed that misses counts as infinitely slow,
  so a setting whose seeds mostly miss is "not reached"), and, when every seed reaches the target, the
  mean with its 95% t interval;
* reached? the one-sided t-test of the seeds' final values against the target (modded-nanogpt's rule for a
  record): H0 the setting's mean final value is at the target or worse, rejected at p < 0.05;
* against the baseline: the ratio of steps (and of seconds) to target, baseline / setting (> 1: faster),
  from the per-seed log times: paired where the seeds match, else Welch; with its 95% interval, p and
  Holm's correction over the settings compared;
* throughput: a run's tokens / train_time at its last line; a setting's is the mean over its seeds. The
  speedup per second is the speedup in data times the ratio of throughputs (Marin's form), valid for
  the hardware the seconds were measured on (each run's metrics name it).

The report's default target here is the baseline's median final value (the median time of its seeds
then reaches it at about its last evaluation); --target sets it, as it sets the tokens-to-target speedup's
(whose default, the baseline's mean final value, goes with the seed-mean curves it reads).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mars.analysis.runs import Run
from mars.analysis.significance import ALPHA, LEVEL, Comparison, compare

TIME_KEY = "train_time"


@dataclass(frozen=True)
class Crossing:
    """Where a run reaches the target: steps, tokens and training seconds (None: not logged)."""

    steps: float
    tokens: float
    seconds: float | None


def series(run: Run, key: str) -> list[tuple[float, float, float | None, float]]:
    """(steps, tokens, train_time, value) of a metric's finite points in token order, a fork's parent's
    evaluations up to the fork first; train_time is None where the line has none (runs logged before it)."""
    own = [p for p in run.metrics.get(key, ()) if math.isfinite(p.value) and math.isfinite(p.tokens)]
    per_step = next((p.tokens / p.step for p in own if p.step > 0), None)
    times = {p.tokens: p.value for p in run.metrics.get(TIME_KEY, ())}
    points = {}
    if run.lineage:
        parent_times = {t: v for t, _, v in run.parent_points(TIME_KEY)}
        for tokens, _, value in run.parent_points(key):
            if math.isfinite(value) and per_step:
                points[tokens] = (tokens / per_step, tokens, parent_times.get(tokens), value)
    for p in own:
        points[p.tokens] = (p.step, p.tokens, times.get(p.tokens), p.value)
    return [points[t] for t in sorted(points)]


def crossing(run: Run, key: str, target: float, higher_is_better: bool = False) -> Crossing | None:
    """Where the run first reaches the target, interpolated linearly between evaluations; None if never."""
    prev = None
    for step, tokens, seconds, value in series(run, key):
        if (value >= target) if higher_is_better else (value <= target):
            if prev is None:
                return Crossing(step, tokens, seconds)
            s0, d0, t0, v0 = prev
            f = (v0 - target) / (v0 - value)
            at_seconds = t0 + f * (seconds - t0) if t0 is not None and seconds is not None else None
            return Crossing(s0 + f * (step - s0), d0 + f * (tokens - d0), at_seconds)
        prev = (step, tokens, seconds, value)
    return None


def throughput(run: Run) -> float | None:
    """Tokens per second of training (its last train_time line), None when the run logged no train_time."""
    points = [p for p in run.metrics.get(TIME_KEY, ()) if p.value > 0 and math.isfinite(p.tokens)]
    if not points:
        return None
    last = max(points, key=lambda p: p.tokens)
    return last.tokens / last.value


@dataclass
class ReachTest:
    """The one-sided t-test that a setting's mean final value beats the target."""

    n: int
    mean: float
    t: float
    p: float

    @property
    def reached(self) -> bool:
        return self.p < ALPHA


def reach_test(finals: Sequence[float], target: float, higher_is_better: bool = False) -> ReachTest | str:
    """H0: the mean final value is at the target or on its worse side; a small p says the setting reaches
    it. Or the reason there is no test."""
    from scipy import stats

    x = np.asarray(finals, dtype=float)
    if x.size < 2:
        return f"needs 2+ seeds ({x.size})"
    if not np.isfinite(x).all():
        return "non-finite final value"
    gain = (x - target) if higher_is_better else (target - x)  # > 0: beyond the target
    sd = float(gain.std(ddof=1))
    if sd == 0:
        t = math.copysign(math.inf, float(gain.mean())) if gain.mean() != 0 else 0.0
        p = 0.0 if gain.mean() > 0 else 1.0
    else:
        t = float(gain.mean() / (sd / math.sqrt(x.size)))
        p = float(stats.t.sf(t, x.size - 1))
    return ReachTest(int(x.size), float(x.mean()), t, p)


def _median(values: Sequence[float | None]) -> float | None:
    """The median over seeds, a seed that misses counted as infinite; None when that makes it infinite."""
    v = np.asarray([math.inf if x is None else x for x in values], dtype=float)
    med = float(np.median(v)) if v.size else math.inf
    return med if math.isfinite(med) else None


def _mean_ci(values: Sequence[float | None]) -> tuple[float, float, float] | None:
    """Mean and its 95% t interval over seeds, when every seed has a value (one seed: no interval)."""
    from scipy import stats

    if not values or any(v is None for v in values):
        return None
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return float(v[0]), math.nan, math.nan
    half = float(stats.t.ppf(0.5 + LEVEL / 2, v.size - 1)) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return float(v.mean()), float(v.mean()) - half, float(v.mean()) + half


@dataclass
class SettingTime:
    """A setting's time to target over its seeds."""

    crossings: list[Crossing | None]
    reach: ReachTest | str
    throughput: float | None  # tokens per second of training, mean over seeds

    @property
    def reached(self) -> int:
        return sum(c is not None for c in self.crossings)

    def values(self, what: str) -> list[float | None]:
        return [None if c is None else getattr(c, what) for c in self.crossings]

    def median(self, what: str) -> float | None:
        return _median(self.values(what))

    def mean_ci(self, what: str) -> tuple[float, float, float] | None:
        return _mean_ci(self.values(what))


def setting_time(runs: Sequence[Run], key: str, target: float, higher_is_better: bool) -> SettingTime:
    finals = [r.final(key) for r in runs]
    rates = [throughput(r) for r in runs]
    return SettingTime(
        crossings=[crossing(r, key, target, higher_is_better) for r in runs],
        reach=reach_test(finals, target, higher_is_better),
        throughput=float(np.mean(rates)) if rates and all(x is not None for x in rates) else None,
    )


@dataclass
class TimeRatio:
    """baseline / setting of the steps (or seconds) to target, from the per-seed log times."""

    ratio: float
    low: float
    high: float
    comparison: Comparison
    p_holm: float | None = None


def time_ratio(mine: SettingTime, base: SettingTime, what: str, paired: bool) -> TimeRatio | str:
    """The ratio of `what` ("steps", "seconds") to target, or why there is none. `mine` lists its runs in
    the baseline's seed order when paired."""
    ours, theirs = mine.values(what), base.values(what)
    if any(v is None for v in ours) or any(v is None for v in theirs):
        if what == "seconds" and mine.reached == len(ours) and base.reached == len(theirs):
            return "no train_time logged"
        return "not reached"
    if any(v <= 0 for v in (*ours, *theirs)):
        return "reached at the first evaluation"
    c = compare(np.log(ours), np.log(theirs), paired=paired)
    if isinstance(c, str):
        return c
    return TimeRatio(math.exp(-c.difference), math.exp(-c.ci[1]), math.exp(-c.ci[0]), c)
