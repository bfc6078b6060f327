"""mars.analysis.stats: each number of the report on inputs whose answer is known in closed form."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from analysis_helpers import EVAL_TOKENS, A, B, C, power_law
from scipy import stats as scipy_stats

from mars.analysis.significance import welch
from mars.analysis.stats import FitError, fit_power_law, mean_curve, mean_std, tokens_to_target


def test_tokens_to_target_interpolates_between_evaluations():
    curve = [(0, 10.0), (100, 6.0), (200, 4.0), (300, 3.0)]
    assert tokens_to_target(curve, 5.0) == pytest.approx(150.0)  # halfway from 6 to 4
    assert tokens_to_target(curve, 6.0) == 100.0  # reached exactly at an evaluation
    assert tokens_to_target(curve, 11.0) == 0.0  # already below at the first point
    assert tokens_to_target(curve, 2.9) is None  # never reached


def test_tokens_to_target_is_the_first_crossing_and_skips_non_finite_points():
    # dips below 5 at 100, comes back above, and a diverged evaluation in between
    curve = [(0, 10.0), (50, float("nan")), (100, 4.0), (200, 6.0), (300, 3.0)]
    assert tokens_to_target(curve, 5.0) == pytest.approx(0 + (10 - 5) / (10 - 4) * 100)


def test_mean_std_is_the_sample_std_and_absent_for_one_seed():
    assert mean_std([1.0, 2.0, 3.0]) == (2.0, 1.0)  # ddof=1: sqrt(((-1)^2 + 0 + 1^2) / 2)
    assert mean_std([4.0]) == (4.0, None)


def test_mean_curve_averages_seeds_over_their_common_range():
    a = [(0, 4.0), (10, 2.0), (20, 1.0)]
    b = [(0, 6.0), (10, 4.0)]  # killed after 10 tokens
    band = mean_curve([a, b])
    assert band.tokens.tolist() == [0, 10]
    assert (
        band.mean.tolist() == [5.0, 3.0]
        and band.low.tolist() == [4.0, 2.0]
        and band.high.tolist() == [6.0, 4.0]
    )
    assert band.std == pytest.approx([math.sqrt(2)] * 2)
    # different evaluation points: each seed is interpolated onto the union of points
    band = mean_curve([[(0, 4.0), (20, 2.0)], [(0, 6.0), (10, 5.0), (20, 4.0)]])
    assert band.tokens.tolist() == [0, 10, 20] and band.mean.tolist() == [5.0, 4.0, 3.0]


def test_power_law_fit_recovers_an_exact_power_law():
    fit = fit_power_law([(d, power_law(d)) for d in EVAL_TOKENS])
    assert fit.n_points == len(EVAL_TOKENS) - 1  # D = 0 is left out
    assert (fit.a, fit.b, fit.c) == (
        pytest.approx(A, rel=1e-4),
        pytest.approx(B, rel=1e-4),
        pytest.approx(C, rel=1e-5),
    )
    assert fit.tokens_for(power_law(123_456.0)) == pytest.approx(123_456.0, rel=1e-4)
    assert fit.tokens_for(C - 0.1) is None and fit.tokens_for(fit.c) is None  # at or below the asymptote


def test_power_law_fit_recovers_other_parameters_at_paper_scale():
    tokens = np.geomspace(1e8, 5e10, 40)
    fit = fit_power_law([(d, 2.5 + 40.0 * d**-0.2) for d in tokens])
    assert (fit.a, fit.b, fit.c) == (
        pytest.approx(40.0, rel=1e-3),
        pytest.approx(0.2, rel=1e-3),
        pytest.approx(2.5, rel=1e-4),
    )


def test_power_law_fit_refuses_too_few_points_and_rising_losses():
    with pytest.raises(FitError, match="at least 4 evaluations"):
        fit_power_law([(0, 10.0), (100, 3.0), (200, 2.9), (300, 2.8)])
    with pytest.raises(FitError, match="does not fall"):
        fit_power_law([(d, 1.0 + d / 1e5) for d in EVAL_TOKENS[1:]])


def test_power_law_fit_refuses_an_exponent_pinned_at_its_bound():
    """A least-squares optimum on the exponent's bound is no power law (a CPU size ladder gave alpha 5 and
    1e-4 in 5 of 8 fits, each shown as a fit): the reason comes back instead of those numbers."""
    sizes = [1e5, 4e5, 1.6e6]
    with pytest.raises(FitError, match="exponent at its bound 5 .a drop too steep"):
        fit_power_law(
            [(n, 6.0 + 1e40 * n**-8.0) for n in sizes], min_points=3, what="adamw", x_name="parameters"
        )
    with pytest.raises(FitError, match="exponent at its bound 0.0001 .next to no fall"):
        # adamw at 300 steps on that ladder: the middle size is best, the losses do not fall with size
        fit_power_law([(1e5, 6.036), (4e5, 5.836), (1.6e6, 6.130)], min_points=3, what="adamw")
    fit = fit_power_law([(n, 6.0 + 300.0 * n**-0.5) for n in sizes], min_points=3)  # inside: kept
    assert fit.b == pytest.approx(0.5, rel=1e-3)


def welch_by_hand(x: list[float], y: list[float]) -> tuple[float, float, float]:
    """Welch's t, the Welch-Satterthwaite degrees of freedom, and the two-sided p (t.sf for the tail)."""
    vx, vy = statistics.variance(x) / len(x), statistics.variance(y) / len(y)
    t = (statistics.fmean(x) - statistics.fmean(y)) / math.sqrt(vx + vy)
    df = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    return t, df, 2 * scipy_stats.t.sf(abs(t), df)


def test_welch_matches_the_formula():
    x, y = [2.90, 2.95, 2.93], [3.01, 3.00, 3.04, 2.99]
    res = welch(x, y)
    t, df, p = welch_by_hand(x, y)
    assert (res.t, res.df, res.p) == (
        pytest.approx(t, rel=1e-10),
        pytest.approx(df, rel=1e-10),
        pytest.approx(p, rel=1e-8),
    )
    assert res.t < 0 and res.significant == (p < 0.05)


def test_welch_needs_two_seeds_on_each_side():
    assert welch([1.0], [2.0, 2.1]) == "needs 2+ seeds on both sides (1 vs 2)"
    assert welch([1.0, 1.0], [2.0, 2.0]) == "no variance on either side"
    assert welch([1.0, float("nan")], [2.0, 2.1]) == "non-finite final loss"
