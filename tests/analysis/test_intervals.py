"""Intervals of the speedups: the jackknife against its closed form, and its coverage of a known
speedup over many simulated experiments of three or four seeds."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from analysis_helpers import EVAL_TOKENS, power_law, two_group_sweep
from scipy import stats as scipy_stats

from mars.analysis.intervals import jackknife_interval
from mars.analysis.metric import metric_of
from mars.analysis.report import build_report, markdown_table, to_json
from mars.analysis.runs import Point, Run
from mars.analysis.speedups import Speedups

X = np.array([2.91, 2.95, 2.88, 2.97])  # the group's final losses, seeds 1-4
Y = np.array([3.01, 3.02, 2.96, 3.08])  # the baseline's


def exp_mean_difference(keep, keep_base):
    return math.exp(X[keep].mean() - Y[keep_base].mean())


def test_jackknife_of_a_mean_difference_is_the_t_interval():
    """On the log scale the estimate is a difference of means: the jackknife's variance is then
    exactly the t-test's squared standard error, paired and unpaired."""
    n = len(X)
    paired = jackknife_interval(exp_mean_difference, n, n, paired=True)
    d = X - Y
    half = scipy_stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n)
    assert paired.method == "paired jackknife" and paired.df == n - 1
    assert (paired.low, paired.high) == (
        pytest.approx(math.exp(d.mean() - half)),
        pytest.approx(math.exp(d.mean() + half)),
    )
    unpaired = jackknife_interval(exp_mean_difference, n, n, paired=False)
    vx, vy = X.var(ddof=1) / n, Y.var(ddof=1) / n
    df = (vx + vy) ** 2 / (vx**2 / (n - 1) + vy**2 / (n - 1))  # Welch-Satterthwaite
    half = scipy_stats.t.ppf(0.975, df) * math.sqrt(vx + vy)
    assert unpaired.method == "jackknife" and unpaired.df == pytest.approx(df)
    centre = X.mean() - Y.mean()
    assert (unpaired.low, unpaired.high) == (
        pytest.approx(math.exp(centre - half)),
        pytest.approx(math.exp(centre + half)),
    )
    assert jackknife_interval(exp_mean_difference, 1, 4, paired=False).startswith("needs 2+ seeds")


# ----------------------------------------------------------------------------- coverage

TOKENS = np.array(EVAL_TOKENS, dtype=float)
SPEEDUP = 2.0  # the group's loss at D is the baseline's at 2D


def runs_of(curve: np.ndarray, offsets: np.ndarray) -> list[Run]:
    """In-memory runs, one per seed: the curve shifted by the seed's offset at every evaluation."""
    runs = []
    for seed, offset in enumerate(offsets):
        run = Run(config={"train": {"seed": seed}})
        for d, v in zip(TOKENS, curve + offset, strict=True):
            run.add("val/loss", Point(d / 1024, d, math.nan, float(v)))
        runs.append(run)
    return runs


def coverage(replicates, n, paired, target=None, which="speedup", sigma=0.01, rho=0.8, seed=0) -> float:
    """The fraction of simulated experiments whose 95% interval holds the true speedup (2).

    Each experiment draws n seeds per side; a seed shifts a whole curve (offset ~ N(0, sigma^2));
    paired, the group's offset shares a part rho with the baseline's offset of the same seed."""
    rng = np.random.default_rng(seed)
    base_curve = np.array([power_law(d) for d in TOKENS])
    group_curve = np.array([power_law(SPEEDUP * d) for d in TOKENS])
    hits = 0
    for _ in range(replicates):
        base_noise = rng.normal(0, sigma, n)
        own = rng.normal(0, sigma, n)
        group_noise = rho * base_noise + math.sqrt(1 - rho**2) * own if paired else own
        base, group = runs_of(base_curve, base_noise), runs_of(group_curve, group_noise)
        speedups = Speedups(metric_of("val/loss"), target)
        estimate = speedups.speedup if which == "speedup" else speedups.effective_speedup
        interval = jackknife_interval(
            lambda k, kb, f=estimate, g=group, b=base: f([g[i] for i in k], [b[j] for j in kb]), n, n, paired
        )
        assert not isinstance(interval, str), interval
        hits += interval.low <= SPEEDUP <= interval.high
    return hits / replicates


TARGET = power_law(8 * EVAL_TOKENS[1])  # crossed at 8 evaluations by the baseline, 4 by the group


def test_speedup_intervals_cover_the_true_speedup_about_95_percent():
    # 300 experiments: a true coverage of 95% lands within 0.95 +- 0.038 (3 binomial sd)
    assert 0.91 <= coverage(300, 3, paired=True, target=TARGET) <= 0.99
    assert 0.91 <= coverage(300, 4, paired=False, target=TARGET) <= 0.99
    # the default target, the baseline's mean final loss, is recomputed for each left-out seed
    assert 0.90 <= coverage(200, 3, paired=True, target=None) <= 0.99


def test_effective_data_speedup_interval_covers_the_true_speedup():
    # one fit of L(D) per left-out baseline seed: fewer experiments, a wider band
    assert coverage(60, 3, paired=True, which="effective") >= 0.88


# ----------------------------------------------------------------------------- in the report


def test_the_report_gives_intervals_for_both_speedups(tmp_path):
    sweep = two_group_sweep(tmp_path / "sweep")
    report = build_report([sweep])
    base, mars = report.groups
    assert base.speedup_ci is None and base.speedup_ci_note == "baseline"
    for interval, value in ((mars.speedup_ci, mars.speedup), (mars.effective_ci, mars.effective_speedup)):
        assert interval.method == "paired jackknife" and interval.df == 2
        assert interval.low < value < interval.high and interval.low < 2.0 < interval.high
    row = markdown_table(report).splitlines()[3]
    assert row.endswith(
        f"| {mars.speedup_ci.low:.2f}x - {mars.speedup_ci.high:.2f}x "
        f"| {mars.effective_ci.low:.2f}x - {mars.effective_ci.high:.2f}x |"
    )
    unpaired = build_report([sweep], paired=False).groups[1]
    assert unpaired.speedup_ci.method == "jackknife" and unpaired.speedup == pytest.approx(mars.speedup)
    group = json.loads(json.dumps(to_json(report)))["groups"][1]
    assert group["speedup_interval"]["low"] == pytest.approx(mars.speedup_ci.low)
    assert group["effective_data"]["interval"]["method"] == "paired jackknife"


def test_an_interval_that_cannot_be_made_says_why(tmp_path):
    # a target the baseline's mean curve only just reaches: without its best seed (offset -0.01) it does not
    sweep = two_group_sweep(tmp_path / "sweep")
    report = build_report([sweep], target=power_law(EVAL_TOKENS[-1]) + 0.004)
    mars = report.groups[1]
    assert mars.speedup is not None and mars.speedup_ci is None
    assert mars.speedup_ci_note == "leaving one seed out: the baseline does not reach the target"
    assert "n/a (leaving one seed out: the baseline does not reach the target)" in markdown_table(report)
