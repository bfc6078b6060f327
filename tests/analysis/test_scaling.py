"""The fits over budgets and sizes (mars.analysis.scaling) on synthetic finals with known E, A, alpha and
known speedups: exact without noise, intervals that cover the truth at about their level with noise."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mars.analysis.scaling import (
    SpeedupFits,
    budget_table,
    extrapolation_label,
    fit,
    parameter_intervals,
    speedup_at,
)
from mars.analysis.significance import compare, holm

E, A, ALPHA = 3.0, 40.0, 0.35
BUDGETS = [1e4, 2e4, 4e4, 8e4]


def law(d, k=1.0):
    return E + A * (k * d) ** -ALPHA


def finals(budgets, seeds, k=1.0, noise=None, rng=None):
    """{D: {seed: L(kD) + noise}}: an arm that reaches the baseline's loss with 1/k of its data."""
    out = {}
    for d in budgets:
        out[d] = {s: law(d, k) + (noise(s, d) if noise else 0.0) + (rng.normal(0, 0.01) if rng else 0.0)
                  for s in seeds}  # fmt: skip
    return out


def test_noiseless_fit_recovers_the_law_exactly():
    for budgets in (BUDGETS, BUDGETS[:3]):  # 3 points: as many as parameters, still exact
        f = fit(finals(budgets, [1, 2, 3]), [1, 2, 3])
        assert not isinstance(f, str), f
        assert f.c == pytest.approx(E, rel=1e-5)
        assert f.a == pytest.approx(A, rel=1e-4)
        assert f.b == pytest.approx(ALPHA, rel=1e-5)
    sizes = {
        1e5: {1: 2.0 + 900 * 1e5**-0.5},
        4e5: {1: 2.0 + 900 * 4e5**-0.5},
        1.6e6: {1: 2.0 + 900 * 1.6e6**-0.5},
    }
    f = fit(sizes, [1], x="parameters")
    assert (f.c, f.b) == (pytest.approx(2.0, rel=1e-5), pytest.approx(0.5, rel=1e-5))


def test_a_known_speedup_is_recovered_at_every_d_and_beyond():
    k = 1.5
    base, arm = fit(finals(BUDGETS, [1]), [1]), fit(finals(BUDGETS, [1], k), [1])
    for d in (BUDGETS[0], BUDGETS[-1], 4 * BUDGETS[-1]):
        assert speedup_at(base, arm, d) == pytest.approx(k, rel=1e-4)


def test_noise_a_seed_shares_across_arms_leaves_a_paired_interval_on_the_truth():
    """Each seed shifts both arms alike (the same data order): the pairing removes it exactly."""
    shift = {1: 0.02, 2: -0.03, 3: 0.01}
    sf = SpeedupFits(
        finals(BUDGETS, shift, 2.0, lambda s, d: shift[s]), finals(BUDGETS, shift, 1.0, lambda s, d: shift[s])
    )
    p = sf.at(BUDGETS[-1])
    assert p.value == pytest.approx(2.0, rel=1e-4)
    assert p.interval.low == pytest.approx(2.0, rel=1e-3) and p.interval.high == pytest.approx(2.0, rel=1e-3)
    assert p.interval.method == "paired jackknife" and not p.extrapolated


def test_speedup_interval_covers_the_truth_at_its_level_with_known_noise():
    """Independent noise (sd 0.01) on every run, 4 seeds x 4 budgets: the 95% interval at a measured D
    covers the true speedup in about 95% of 60 simulated studies (94/100 seen when written)."""
    rng = np.random.default_rng(0)
    seeds = [1, 2, 3, 4]
    hits = 0
    n = 60
    for _ in range(n):
        p = SpeedupFits(finals(BUDGETS, seeds, 1.5, rng=rng), finals(BUDGETS, seeds, 1.0, rng=rng)).at(4e4)
        hits += not isinstance(p.interval, str) and p.interval.low <= 1.5 <= p.interval.high
    assert hits / n >= 0.85


def test_parameter_intervals_cover_the_truth_with_noise():
    rng = np.random.default_rng(1)
    seeds = [1, 2, 3, 4, 5]
    ivals = parameter_intervals(finals(BUDGETS, seeds, rng=rng), seeds)
    assert ivals["E"].low <= E <= ivals["E"].high
    assert ivals["alpha"].low <= ALPHA <= ivals["alpha"].high


def test_extrapolation_is_labelled_with_its_factor():
    sf = SpeedupFits(finals(BUDGETS, [1, 2], 1.2), finals(BUDGETS, [1, 2]))
    inside, beyond = sf.at(BUDGETS[-1]), sf.at(4 * BUDGETS[-1])
    assert not inside.extrapolated and extrapolation_label(inside.extrapolation) == ""
    assert beyond.extrapolated and extrapolation_label(beyond.extrapolation) == "x4 beyond the largest budget"
    factors = [p.extrapolation for p in sf.curve(BUDGETS[0], 4 * BUDGETS[-1], 3)]
    assert factors == pytest.approx([0.125, math.sqrt(0.125 * 4), 4.0])


def test_fits_that_cannot_be_made_say_why_in_one_line():
    two = fit(finals(BUDGETS[:2], [1]), [1], what="adamw")
    assert two == "needs at least 3 points with tokens > 0, adamw has 2"
    flat = fit({d: {1: 4.0 + 1e-3 * i} for i, d in enumerate(BUDGETS)}, [1], what="adamw")
    assert flat == "adamw's loss does not fall as tokens grow"
    diverged = fit({**finals(BUDGETS, [1]), 1e5: {1: math.nan}}, [1], what="adamw")
    assert "non-finite" in diverged
    p = SpeedupFits(finals(BUDGETS[:2], [1, 2], 1.5), finals(BUDGETS, [1, 2])).at(BUDGETS[-1])
    assert p.value is None and p.why.startswith("needs at least 3 points")
    floor = SpeedupFits(finals(BUDGETS, [1, 2], 1.0, lambda s, d: -1.0), finals(BUDGETS, [1, 2])).at(8e6)
    assert floor.value is None and "below the baseline's fitted floor" in floor.why


def test_budget_table_pairs_each_budget_with_the_baseline_and_holm_corrects_the_family():
    cells = {
        ("adamw", "s", 100): {1: 4.0, 2: 4.1, 3: 4.05},
        ("mars", "s", 100): {1: 3.9, 2: 4.05, 3: 3.97},
        ("adamw", "s", 200): {1: 3.5, 2: 3.6, 3: 3.52},
        ("mars", "s", 200): {1: 3.45, 2: 3.5, 3: 3.5},
        ("mars", "m", 200): {1: 3.0},
    }
    rows = budget_table(cells, {"s": 512, "m": 512}, "adamw")
    by = {(r.arm, r.size, r.steps): r for r in rows}
    assert by[("adamw", "s", 100)].comparison is None and by[("adamw", "s", 100)].tokens == 51200
    ps = [
        compare(list(cells[("mars", "s", b)].values()), list(cells[("adamw", "s", b)].values()), True).p
        for b in (100, 200)
    ]
    assert [by[("mars", "s", b)].p_holm for b in (100, 200)] == pytest.approx(holm(ps))
    assert by[("mars", "m", 200)].comparison == "the baseline adamw has no run at this size and budget"


def test_a_seed_that_throws_a_fit_far_gives_an_unbounded_interval_not_a_crash():
    """MARS-AdamW's finals on the CPU ladder at width 64: a loss still falling faster per octave at the
    largest budgets puts E at its bound 0, where leaving a seed out swings it over hundreds of orders of
    magnitude; the interval's upper end is inf rather than an OverflowError."""
    finals = {
        51200: {1: 6.62108302116394, 2: 6.633950233459473, 3: 6.597994863986969},
        102400: {1: 6.4682698249816895, 2: 6.37189120054245, 3: 6.348406255245209},
        153600: {1: 6.2970898151397705, 2: 6.202661454677582, 3: 6.0594900250434875},
        204800: {1: 6.039349257946014, 2: 5.956654727458954, 3: 5.845054566860199},
    }
    e = parameter_intervals(finals, [1, 2, 3])["E"]
    assert e.low < 1e-10 and e.high == math.inf
