"""The report's verdicts: paired vs Welch tests, Holm's correction, power and seeds needed, each on
inputs whose answer is known by hand or from published tables."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from analysis_helpers import seeded_sweep
from scipy import stats as scipy_stats
from test_stats import welch_by_hand

from mars.analysis.cli import report_main
from mars.analysis.report import build_report, comparison_table, render_markdown
from mars.analysis.significance import Spread, compare, detectable_difference, holm, power, seeds_needed

# Seeds share most of their noise: seed 1 lands 0.08 above the others' mean at any setting, etc.
SEED_EFFECT = (0.08, -0.05, 0.03, -0.06)
BASE = [3.0 + e for e in SEED_EFFECT]
BETTER = [3.0 + e - 0.02 + j for e, j in zip(SEED_EFFECT, (0.001, -0.001, 0.0005, -0.0005), strict=True)]


def paired_by_hand(x, y):
    d = [a - b for a, b in zip(x, y, strict=True)]
    t = statistics.fmean(d) / (statistics.stdev(d) / math.sqrt(len(d)))
    return statistics.fmean(d), t, 2 * scipy_stats.t.sf(abs(t), len(d) - 1)


@pytest.fixture(scope="module")
def correlated(tmp_path_factory):
    """lr 0.006 (baseline) and lr 0.003, 0.02 better on every one of the same four seeds."""
    return seeded_sweep(tmp_path_factory.mktemp("paired") / "sweep", {"0.006": BASE, "0.003": BETTER})


def test_paired_test_finds_what_welch_cannot_on_correlated_noise(correlated, capsys):
    report = build_report([correlated], baseline=["optimizer.lr=0.006"])
    group = report.groups[0]
    assert group.label == "lr=0.003" and not group.baseline
    c = group.comparison
    diff, t, p = paired_by_hand(BETTER, BASE)
    assert c.test == "paired" and c.n == 4 and group.comparison_note == ""
    assert (c.difference, c.t, c.df, c.p) == (
        pytest.approx(diff),
        pytest.approx(t),
        3,
        pytest.approx(p, rel=1e-6),
    )
    assert c.differences == pytest.approx([b - a for a, b in zip(BASE, BETTER, strict=True)])
    assert p < 1e-4 and c.p_holm == pytest.approx(p) and c.significant  # one comparison: Holm changes nothing
    # the same runs through Welch's test: the seed effects swamp the difference
    wt, wdf, wp = welch_by_hand(BETTER, BASE)
    assert (group.welch.t, group.welch.p) == (pytest.approx(wt), pytest.approx(wp, rel=1e-6)) and wp > 0.5
    unpaired = build_report([correlated], baseline=["optimizer.lr=0.006"], paired=False).groups[0]
    assert unpaired.comparison.test == "Welch" and unpaired.comparison_note == "--unpaired"
    assert unpaired.comparison.p == pytest.approx(wp, rel=1e-6) and not unpaired.comparison.significant
    table = comparison_table(report)
    assert "| 0.003 | paired, n=4 | -0.0200 (" in table and "| better |" in table
    assert "| Welch (--unpaired), n=4 vs 4 |" in comparison_table(build_report([correlated], paired=False))
    # the command line: --unpaired, and the verdict table printed after the group table
    assert report_main([str(correlated), "--baseline", "optimizer.lr=0.006", "--unpaired"]) == 0
    out = capsys.readouterr().out
    assert "Welch's test (--unpaired)" in out and "| not resolved |" in out


def test_groups_on_other_seeds_fall_back_to_welch_and_say_why(tmp_path):
    sweep = seeded_sweep(tmp_path / "s", {"0.006": BASE, "0.003": BETTER}, seeds={"0.003": (5, 6, 7, 8)})
    group = build_report([sweep], baseline=["optimizer.lr=0.006"]).groups[0]
    assert group.comparison.test == "Welch" and group.comparison_note == "the seeds differ"
    assert group.comparison.p == pytest.approx(welch_by_hand(BETTER, BASE)[2], rel=1e-6)
    assert group.speedup_ci is None or group.speedup_ci.method == "jackknife"


def test_holm_adjusts_a_known_family():
    # by hand: sorted 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1, raised to 0.06)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.2]) == pytest.approx([0.5, 0.4])
    assert holm([0.9, 0.8, 0.7]) == [1.0, 1.0, 1.0]  # capped at 1
    assert holm([0.04]) == [0.04] and holm([]) == []


def test_the_report_corrects_every_comparison_with_the_baseline(tmp_path):
    """Three groups on the baseline's three seeds: B's p < 0.05 alone, but not after Holm (m = 3)."""
    e = np.array([0.05, -0.03, -0.02])
    d = {
        "0.001": -0.03 + np.array([0.002, -0.001, -0.001]),
        "0.002": -0.012 + np.array([0.003, -0.004, 0.001]),
        "0.004": 0.004 + np.array([0.006, -0.004, -0.002]),
    }
    finals = {"0.006": (3 + e).tolist(), **{lr: (3 + e + x).tolist() for lr, x in d.items()}}
    report = build_report([seeded_sweep(tmp_path / "s", finals)], baseline=["optimizer.lr=0.006"])
    by_lr = {g.label: g for g in report.groups}
    raw = {lr: scipy_stats.ttest_rel(3 + e + x, 3 + e).pvalue for lr, x in d.items()}
    # Holm by hand: 0.0011 x 3; 0.0288 x 2 = 0.0576; max(0.0576, 0.3206 x 1)
    expected = {"0.001": 3 * raw["0.001"], "0.002": 2 * raw["0.002"], "0.004": raw["0.004"]}
    assert report.n_compared == 3
    for lr in d:
        c = by_lr[f"lr={lr}"].comparison
        assert c.test == "paired" and c.p == pytest.approx(raw[lr], rel=1e-6)
        assert c.p_holm == pytest.approx(expected[lr], rel=1e-6)
    assert raw["0.002"] < 0.05 <= by_lr["lr=0.002"].comparison.p_holm
    verdicts = {lr: by_lr[f"lr={lr}"].comparison.significant for lr in d}
    assert verdicts == {"0.001": True, "0.002": False, "0.004": False}
    md = render_markdown(report)
    assert "p (Holm) corrected over the 3 comparison(s) with the baseline" in md
    assert "multiply the k-th smallest by m - k + 1" in md
    row = next(line for line in md.splitlines() if line.startswith("| 0.002 | paired"))
    assert f"| {raw['0.002']:.3g} | {expected['0.002']:.3g} | not resolved |" in row


# ----------------------------------------------------------------------------- power


@pytest.mark.parametrize(
    ("effect", "two_sample", "paired"),
    # G*Power 3.1 (exact noncentral t), power 0.80, two-sided alpha 0.05: n per group for two
    # independent groups (Cohen's table gives 393 / 64 / 26 for d = 0.2 / 0.5 / 0.8), n pairs for dz
    [(0.2, 394, 199), (0.5, 64, 34), (0.8, 26, 15), (1.0, 17, 10)],
)
def test_seeds_needed_match_published_sample_sizes(effect, two_sample, paired):
    assert seeds_needed(effect, Spread(False, 1.0, 1.0)) == two_sample
    assert seeds_needed(effect, Spread(True, 1.0)) == paired
    assert seeds_needed(-effect, Spread(True, 1.0)) == paired  # two-sided: the sign does not matter


def test_seeds_needed_approach_the_normal_formula_and_give_up_sensibly():
    # n = ((z_0.975 + z_0.8) * sd / delta)^2 for large n: the t test needs one or two seeds more
    z = scipy_stats.norm.ppf(0.975) + scipy_stats.norm.ppf(0.8)
    n = seeds_needed(0.05, Spread(True, 1.0))
    assert math.ceil((z / 0.05) ** 2) <= n <= math.ceil((z / 0.05) ** 2) + 2
    assert seeds_needed(0.0, Spread(True, 1.0)) is None  # no difference: no number of seeds
    assert seeds_needed(1e-4, Spread(True, 1.0)) is None  # beyond a million
    n = seeds_needed(0.3, Spread(False, 0.5, 2.0))  # unequal spreads: Welch's df
    se, df = Spread(False, 0.5, 2.0).se_df(n)
    assert power(0.3, se, df) >= 0.8 > power(0.3, *Spread(False, 0.5, 2.0).se_df(n - 1))


def test_detectable_difference_has_eighty_percent_power():
    assert detectable_difference(1.0, 1e9) == pytest.approx(2.8016, abs=1e-4)  # z_0.975 + z_0.8
    for df in (2, 3, 9):
        assert power(detectable_difference(0.1, df), 0.1, df) == pytest.approx(0.8, abs=1e-9)
    # 3 paired seeds (df 2) need 5.65 standard errors; 3 a side with equal spread (df 4) 3.76
    assert detectable_difference(1.0, 2) == pytest.approx(5.65, abs=0.01)
    assert detectable_difference(1.0, 4) == pytest.approx(3.76, abs=0.01)


def test_power_agrees_with_simulated_t_tests():
    """The noncentral-t power of a paired test of 4 seeds against the rejection rate of 40000
    simulated experiments."""
    rng = np.random.default_rng(0)
    n, sd, delta = 4, 1.0, 1.5
    d = rng.normal(delta, sd, size=(40_000, n))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
    rate = float(np.mean(np.abs(t) > scipy_stats.t.ppf(0.975, n - 1)))
    assert power(delta, sd / math.sqrt(n), n - 1) == pytest.approx(rate, abs=0.01)


def test_the_report_prints_detectable_difference_and_seeds_needed_with_the_verdict(correlated):
    report = build_report([correlated], baseline=["optimizer.lr=0.006"], paired=False)
    c = report.groups[0].comparison
    spread = Spread(False, statistics.variance(BETTER), statistics.variance(BASE))
    se, df = spread.se_df(4, 4)
    assert (c.se, c.df) == (pytest.approx(se), pytest.approx(df))
    assert c.detectable == pytest.approx(detectable_difference(se, df))
    assert c.seeds_needed == seeds_needed(c.difference, spread) and c.seeds_needed > 50
    row = comparison_table(report).splitlines()[2]
    assert row.endswith(f"| not resolved | {c.detectable:.4f} | {c.seeds_needed} |")
    paired = build_report([correlated], baseline=["optimizer.lr=0.006"]).groups[0].comparison
    assert paired.detectable < c.detectable / 20 and paired.seeds_needed == 2


def test_comparisons_that_cannot_be_made_say_why():
    assert compare([1.0], [2.0], paired=True) == "needs 2+ paired seeds (1)"
    assert compare([1.0, 2.0], [2.0, 3.0], paired=True).startswith("the per-seed differences are all equal")
    assert compare([1.0, math.nan], [2.0, 3.0], paired=True) == "non-finite final loss"
    assert compare([1.0], [2.0, 2.1], paired=False) == "needs 2+ seeds on both sides (1 vs 2)"
