"""Time to target (mars.analysis.time_to_target) on synthetic runs whose crossings are known: steps, tokens
and seconds interpolated linearly between evaluations, "not reached" where a run (or most of a setting's
seeds) never gets there, the one-sided test's error rate at its nominal level over simulated seeds, the
ratios against the baseline, and the report's wall-clock table (speedup per second = speedup in data x
the throughput ratio, on the hardware the runs name)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from analysis_helpers import TOKENS_PER_STEP, config, write_records

from mars.analysis import build_report, load_run
from mars.analysis.report import render_markdown, to_json
from mars.analysis.time_to_target import crossing, reach_test, setting_time, time_ratio

HW = "1 process x 1 thread of a test CPU (2 cores)"


def records(values, seconds, step_every=10, ms=(10.0, 6.0, 3.5)) -> list[dict]:
    """Evaluations every `step_every` steps with these values and train_time; a training line before each
    (after the first) with the step time split."""
    out = []
    for i, (v, t) in enumerate(zip(values, seconds, strict=True)):
        step = i * step_every
        tokens = step * TOKENS_PER_STEP
        if i:
            split = {"ms_per_step": ms[0], "ms_forward_backward": ms[1], "ms_optimizer": ms[2]}
            out.append({"step": step, "tokens": tokens, "train/loss": v + 0.05, "train_time": t, **split})
        line = {"step": step, "tokens": tokens, "val/loss": v, "train_time": t}
        if i == 0:
            line["hardware"] = HW
        out.append(line)
    return out


def run(tmp_path, name, values, seconds, seed=1, optimizer="adamw", **kw):
    cfg = config(
        **{"optimizer.name": optimizer, "train.seed": seed, "train.max_steps": 10 * (len(values) - 1)}
    )
    overrides = [f"optimizer={optimizer}", f"train.seed={seed}"]
    return write_records(tmp_path / name, cfg, overrides, records(values, seconds, **kw))


def test_crossings_are_interpolated_between_evaluations_in_steps_tokens_and_seconds(tmp_path):
    # between step 10 (6.0, 1.0 s) and step 20 (4.0, 2.5 s) the target 5.0 is half way
    r = load_run(run(tmp_path, "a", [10.0, 6.0, 4.0, 3.0], [0.0, 1.0, 2.5, 4.0]))
    c = crossing(r, "val/loss", 5.0)
    assert (c.steps, c.tokens, c.seconds) == (15.0, 15 * TOKENS_PER_STEP, 1.75)
    assert crossing(r, "val/loss", 4.0).steps == 20.0  # exactly at an evaluation
    assert crossing(r, "val/loss", 12.0).steps == 0.0  # the first evaluation already there
    assert crossing(r, "val/loss", 2.9) is None  # never: not reached, not a number
    assert crossing(r, "val/loss", 11.0, higher_is_better=True) is None  # never rises to 11


def test_a_fork_reaches_the_target_on_its_parents_curve(tmp_path):
    """A branch's metrics.jsonl holds its own steps only; its crossing may lie before the fork."""
    parent = run(tmp_path, "trunk", [10.0, 6.0, 4.0, 3.0], [0.0, 1.0, 2.5, 4.0])
    branch = write_records(
        tmp_path / "branch", config(), [], records([10.0, 6.0, 4.0, 3.5], [0, 1.0, 2.5, 3.9])[-2:]
    )
    (branch / "lineage.json").write_text(
        json.dumps({"kind": "fork", "parent_run_dir": str(parent), "step": 20})
    )
    c = crossing(load_run(branch), "val/loss", 5.0)
    assert (c.steps, c.seconds) == (15.0, 1.75)


def test_a_setting_is_not_reached_when_most_of_its_seeds_miss(tmp_path):
    up = [10.0, 6.0, 4.0]
    runs = [
        load_run(run(tmp_path, "s1", up, [0, 1, 2], seed=1)),  # 15 steps to 5.0
        load_run(run(tmp_path, "s2", [10.0, 7.0, 4.0], [0, 1, 2], seed=2)),  # 16.67
        load_run(run(tmp_path, "s3", [10.0, 7.0, 5.5], [0, 1, 2], seed=3)),  # never
    ]
    t = setting_time(runs, "val/loss", 5.0, False)
    assert t.reached == 2 and t.median("steps") == pytest.approx(50 / 3)  # the middle seed
    assert t.mean_ci("steps") is None  # a seed that misses has no number to average
    worse = setting_time([runs[0], runs[2], runs[2]], "val/loss", 5.0, False)
    assert worse.reached == 1 and worse.median("steps") is None  # most seeds miss: not reached
    assert time_ratio(worse, t, "steps", paired=False) == "not reached"


def test_the_one_sided_test_rejects_at_its_nominal_rate_when_the_setting_sits_at_the_target():
    """Finals drawn around the target itself (the null's edge): 'reached' in about 5% of simulated
    studies, for 3 and for 5 seeds; a setting 2 sigma below the target is found most of the time."""
    rng = np.random.default_rng(0)
    for n in (3, 5):
        rejections = [reach_test(rng.normal(3.0, 0.05, n), 3.0).reached for _ in range(4000)]
        assert 0.04 <= np.mean(rejections) <= 0.06, n
    found = [reach_test(rng.normal(2.9, 0.05, 5), 3.0).reached for _ in range(1000)]
    assert np.mean(found) > 0.9
    higher = reach_test([0.61, 0.62, 0.63], 0.5, higher_is_better=True)  # accuracy above its target
    assert higher.reached and reach_test([0.4, 0.41, 0.42], 0.5, higher_is_better=True).p > 0.99
    assert reach_test([2.0], 3.0) == "needs 2+ seeds (1)"


def test_the_report_gives_time_to_target_and_speedups_per_token_and_per_second(tmp_path):
    """AdamW reaches 5.0 at step 15 on each seed; MARS at step 10 (1.5x fewer steps) but each of its steps
    takes twice the seconds: per token 1.5x, per second 0.75x. A third setting never gets there."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    job = 0
    for name, values, seconds, ms in (
        ("adamw", [10.0, 6.0, 4.0, 3.0], [0.0, 1.0, 2.0, 3.0], (100.0, 60.0, 40.0)),
        ("mars_adamw", [10.0, 5.0, 3.5, 2.9], [0.0, 2.0, 4.0, 6.0], (200.0, 80.0, 120.0)),
        ("lion", [10.0, 8.0, 7.0, 6.0], [0.0, 1.0, 2.0, 3.0], (100.0, 60.0, 40.0)),
    ):
        for seed, shift in ((1, -0.01), (2, 0.0), (3, 0.01)):
            run(sweep, str(job), [v + shift for v in values], seconds, seed=seed, optimizer=name, ms=ms)
            job += 1
    report = build_report([sweep], baseline=["optimizer.name=adamw"], target=5.0)
    base, lion, mars = report.groups  # sorted by label
    assert [g.label for g in report.groups] == ["AdamW", "Lion", "MARS-AdamW (approx)"]
    assert base.time.median("steps") == pytest.approx(15.0, abs=0.1) and mars.time.median(
        "steps"
    ) == pytest.approx(10.0, abs=0.1)
    assert lion.time.reached == 0 and lion.steps_ratio == "not reached"
    assert (
        mars.steps_ratio.ratio == pytest.approx(1.5, rel=0.02)
        and mars.steps_ratio.comparison.test == "paired"
    )
    assert mars.seconds_ratio.ratio == pytest.approx(0.75, rel=0.02)
    assert mars.time.throughput == pytest.approx(base.time.throughput / 2)
    assert mars.split_ms == (200.0, 80.0, 120.0)
    text = render_markdown(report)
    assert "## Time to target and wall-clock" in text and f"Seconds measured on {HW}" in text
    lion_row = next(line for line in text.splitlines() if line.startswith("| Lion | 0/3 |"))
    assert lion_row.count("not reached") >= 3
    js = to_json(report)
    mars_js = js["groups"][2]["time_to_target"]
    assert js["hardware"] == [HW] and mars_js["reached"] == 3
    assert mars_js["speedup_per_second"] == pytest.approx(mars.speedup * 0.5)
    assert mars_js["reach_test"]["reached"] and not js["groups"][1]["time_to_target"]["reach_test"]["reached"]
    assert math.isclose(mars_js["seconds_median"], 2 * mars_js["steps_median"] / 10, rel_tol=1e-9)


def test_the_performance_profile_counts_the_cells_within_tau_of_the_best():
    """AlgoPerf's rho(tau) over cells: costs from each arm's loss over budgets (linear in tokens between
    budgets; already there at the smallest: its tokens; never: infinite)."""
    from mars.analysis.profile import profile, ratios, tokens_to_reach

    curve = [(100.0, 5.0), (200.0, 4.0), (400.0, 3.0)]
    assert tokens_to_reach(curve, 4.5) == 150.0 and tokens_to_reach(curve, 6.0) == 100.0
    assert tokens_to_reach(curve, 2.0) == math.inf
    costs = {"x": {"a": 100.0, "b": 150.0, "c": math.inf}, "y": {"a": 300.0, "b": 200.0, "c": 400.0}}
    r = ratios(costs)  # per arm, per cell: its cost over the cell's best
    assert r["a"] == {"x": 1.0, "y": 1.5} and r["b"] == {"x": 1.5, "y": 1.0}
    assert r["c"]["x"] == math.inf and r["c"]["y"] == 2.0
    assert [profile(r["a"], tau) for tau in (1.0, 1.4, 1.5)] == [0.5, 0.5, 1.0]
    assert [profile(r["c"], tau) for tau in (1.0, 2.0, 100.0)] == [0.0, 0.5, 0.5]
