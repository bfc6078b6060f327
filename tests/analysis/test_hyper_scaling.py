"""mars.analysis.hyper_scaling on synthetic optima with a known power law: the exponent recovered with an
interval that covers it, a held-out size predicted inside its interval, a flat key not moving, and
every fit that cannot be made a one-line reason."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mars.analysis.hyper_scaling import check, fit_rule, floor_of, resolution

SIZES = [1e4, 4e4, 1.6e5, 6.4e5, 2.56e6]  # N, a factor 4 apart
NOISE = 0.1  # the searched optima's scatter, log scale (about a search's resolution)


def noisy(law, xs, seed=0):
    rng = np.random.default_rng(seed)
    return [((x,), law(x) * math.exp(NOISE * rng.standard_normal())) for x in xs]


def test_an_exact_law_is_recovered_exactly_and_predicts_a_new_size():
    rule = fit_rule([((n,), 3.0 * n**-0.5) for n in SIZES[:3]])
    assert rule.exponent() == pytest.approx(-0.5) and rule.c == pytest.approx(3.0)
    assert rule.predict((SIZES[4],)) == pytest.approx(3.0 * SIZES[4] ** -0.5)
    assert rule.formula() == "h*(N) = 3 N^-0.5"


def test_a_noisy_law_is_recovered_and_the_held_out_size_falls_inside_its_interval():
    law = lambda n: 0.02 * n**-0.35
    points = noisy(law, SIZES)
    rule = fit_rule(points[:-1])  # the largest size held out
    lo, hi = rule.exponent_interval()
    assert lo < -0.35 < hi  # the interval covers the truth
    assert rule.exponent() == pytest.approx(-0.35, abs=0.1)
    assert rule.moves() is True  # ... and excludes 0: the key moves with scale
    (n,), searched = points[-1]
    c = check(rule, (n,), searched)
    assert c.inside and c.verdict() == "inside"
    assert c.interval[0] < law(n) < c.interval[1]
    assert c.predicted == pytest.approx(law(n), rel=0.3)


def test_a_flat_key_does_not_move():
    points = noisy(lambda n: 0.9, SIZES, seed=1)  # e.g. beta1: the same optimum at every size
    rule = fit_rule(points)
    lo, hi = rule.exponent_interval()
    assert lo < 0 < hi and rule.moves() is False
    assert abs(rule.exponent()) < 0.05


def test_a_law_in_size_and_data_recovers_both_exponents():
    pts = [((n, d), 0.01 * n**-0.3 * d**0.2) for n in SIZES[:3] for d in (1e6, 4e6)]
    rule = fit_rule(pts, ("N", "D"))
    assert rule.exponent("N") == pytest.approx(-0.3) and rule.exponent("D") == pytest.approx(0.2)
    assert rule.df == 3 and rule.formula().startswith("h*(N, D) = 0.01 N^-0.3 D^0.2")


def test_two_sizes_fit_but_give_no_interval():
    rule = fit_rule([((n,), n**-0.5) for n in SIZES[:2]])
    assert rule.exponent() == pytest.approx(-0.5)
    assert rule.moves() is None
    assert rule.exponent_interval() == "no interval: 2 points for 2 parameters, the fit passes through them"
    assert check(rule, (SIZES[3],), 1.0).verdict() == "no interval"


def test_the_search_resolution_is_a_floor_under_the_scatter():
    """Optima that line up by luck leave residuals far below the search's resolution: the intervals then
    take the floor (normal quantile), and 2 sizes get one too."""
    # a grid of factor-2 steps: the optimum lies within a factor sqrt(2) of the best trial either side
    assert resolution(1.0, [0.25, 0.5, 1.0, 2.0]) == pytest.approx(math.log(2) / math.sqrt(12))
    assert resolution(1.0, [1.0, 2.0]) == pytest.approx(math.log(2) / math.sqrt(12))  # one side, doubled
    assert resolution(1.0, [0.0, 1.0]) is None and floor_of([None, 0.3, 0.4]) == pytest.approx(0.3536, 1e-3)
    exact = [((n,), n**-0.5) for n in SIZES[:3]]
    lo, hi = fit_rule(exact, floor=0.2).exponent_interval()
    sxx = sum((math.log(n) - math.log(SIZES[1])) ** 2 for n in SIZES[:3])
    assert hi - lo == pytest.approx(2 * 1.959964 * 0.2 / math.sqrt(sxx), rel=1e-5)
    two = fit_rule(exact[:2], floor=0.2)
    assert two.df == 0 and check(two, (SIZES[2],), SIZES[2] ** -0.5).inside


@pytest.mark.parametrize(
    ("points", "names", "why"),
    [
        ([((1e4,), 1e-3)], ("N",), "needs at least 2 points for h*(N), has 1"),
        ([((1e4,), 0.0), ((4e4,), 1e-3)], ("N",), "an optimum of 0: a power law needs positive values"),
        ([((1e4,), 1e-3), ((1e4,), 2e-3)], ("N",), "the points do not vary independently in N"),
        ([((n, 1e6), 1e-3) for n in SIZES], ("N", "D"), "the points do not vary independently in N, D"),
    ],
)
def test_a_fit_that_cannot_be_made_is_a_one_line_reason(points, names, why):
    assert fit_rule(points, names).startswith(why)
