"""The edge check (mars.analysis.edges: bracketing) on synthetic objectives, grids, and report.py --edges."""

from __future__ import annotations

import math

import pytest
from analysis_helpers import EVAL_TOKENS, config, power_law, write_run
from scipy.stats import qmc

from mars.analysis.edges import Range, find_edges, sides, swept_range
from mars.analysis.metric import metric_of

RANGES = {"lr": Range(1e-4, 1e-1, log=True), "gamma": Range(0.0, 0.2)}


def sobol_points(objective, n: int = 16, seed: int = 0):
    """n scrambled-Sobol points over RANGES with the objective's value at each: (params, value)."""
    out = []
    for u in qmc.Sobol(2, scramble=True, seed=seed).random(n):
        lr, gamma = 1e-4 * 1000 ** u[0], 0.2 * u[1]
        out.append(({"lr": lr, "gamma": gamma}, objective(lr, gamma)))
    return out


def bowl(opt_lr: float, opt_gamma: float, w_lr: float = 1.0, w_gamma: float = 50.0):
    return lambda lr, gamma: w_lr * math.log(lr / opt_lr) ** 2 + w_gamma * (gamma - opt_gamma) ** 2


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_silent_when_the_optimum_lies_inside(seed):
    assert find_edges(sobol_points(bowl(3e-3, 0.1), seed=seed), RANGES) == []


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    ("opt", "expected"),
    [
        ((1e-5, 0.1), {("lr", "lower")}),
        ((3.0, 0.1), {("lr", "upper")}),
        ((3e-3, 0.5, 0.1, 500.0), {("gamma", "upper")}),  # gamma matters more than lr here
        ((3e-3, -0.3, 0.1, 500.0), {("gamma", "lower")}),
    ],
)
def test_fires_at_the_bound_beyond_which_the_optimum_lies(seed, opt, expected):
    edges = find_edges(sobol_points(bowl(*opt), seed=seed), RANGES, arm="AdamW")
    assert {(e.key, e.bound) for e in edges} == expected
    for e in edges:
        assert e.value == (RANGES[e.key].lo if e.bound == "lower" else RANGES[e.key].hi)
        assert e.line().startswith(f"AdamW: the best {e.key} found")
        assert f"{e.bound} bound" in e.line()


def test_higher_is_better_and_diverged_points_rank_worst():
    points = sobol_points(lambda lr, gamma: -bowl(1e-5, 0.1)(lr, gamma))  # an accuracy, best at low lr
    assert {(e.key, e.bound) for e in find_edges(points, RANGES, higher_is_better=True)} == {("lr", "lower")}
    diverged = [(p, math.nan if p["lr"] < 3e-4 else v) for p, v in sobol_points(bowl(1e-5, 0.1))]
    assert all(e.key != "lr" or e.bound != "lower" for e in find_edges(diverged, RANGES))
    assert find_edges([(p, math.inf) for p, _ in diverged], RANGES) == []


def test_a_key_without_effect_fires_by_chance_unless_the_tolerance_covers_the_noise():
    noisy = [
        ({"lr": p["lr"], "gamma": p["gamma"]}, v + 0.01 * math.sin(1e3 * p["gamma"]))
        for p, v in sobol_points(lambda lr, gamma: math.log(lr / 3e-3) ** 2)
    ]
    fired = find_edges(noisy, RANGES)
    quiet = find_edges(noisy, RANGES, tolerance=0.05)
    assert all(e.key == "gamma" for e in fired)  # gamma does nothing; lr's optimum is inside
    assert quiet == []


@pytest.mark.parametrize("n", [1, 2, 4, 16])
def test_a_monotone_metric_is_an_edge_however_few_points(n):
    """The loss falls with lr over the whole range: its best is never bracketed above, with 1 point or 16
    (the old outer-tenth rule said "at the optimum" for a best at 0.036 of a range up to 0.1)."""
    points = [
        ({"lr": p["lr"], "gamma": p["gamma"]}, -math.log(p["lr"])) for p, _ in sobol_points(bowl(1, 0), n)
    ]
    edges = find_edges(points, {"lr": RANGES["lr"]}, arm="AdamW")
    assert ("lr", "upper") in {(e.key, e.bound) for e in edges}
    best = max(p["lr"] for p, _ in points)
    (upper,) = [e for e in edges if e.bound == "upper"]
    assert upper.best == best and upper.beyond == 0 and "highest tried" in upper.line()


def test_an_interior_optimum_with_a_worse_point_on_each_side_is_no_edge():
    points = [({"lr": lr}, math.log(lr / 3e-3) ** 2) for lr in (1e-3, 3e-3, 1e-2)]
    assert find_edges(points, {"lr": RANGES["lr"]}) == []
    lower, upper = sides(points, "lr")
    assert (lower.nearest, upper.nearest) == (1e-3, 1e-2) and lower.worse_by == pytest.approx(
        math.log(3) ** 2
    )
    # a diverged point beyond the best brackets it: the metric rose there without bound
    assert find_edges([*points[:2], ({"lr": 1e-2}, math.nan)], {"lr": RANGES["lr"]}) == []


def test_points_within_the_tolerance_beyond_the_best_leave_an_edge():
    flat = [({"lr": lr}, v) for lr, v in ((1e-3, 5.30), (2e-3, 5.10), (4e-3, 5.00), (8e-3, 5.02))]
    assert find_edges(flat, {"lr": RANGES["lr"]}) == []  # 8e-3 is worse than 4e-3: bracketed
    (edge,) = find_edges(flat, {"lr": RANGES["lr"]}, tolerance=0.05)
    assert (edge.bound, edge.beyond, edge.best) == ("upper", 1, 4e-3)
    assert "the 1 trial(s) above the best lr found, 0.004, are within the tolerance (0.05)" in edge.line()


def test_a_grid_is_judged_by_its_swept_values():
    grid = [({"lr": lr}, v) for lr, v in ((2e-3, 5.41), (4e-3, 5.46), (8e-3, 5.55))]
    (edge,) = find_edges(grid, {"lr": swept_range([2e-3, 4e-3, 8e-3])}, arm="AdamW")
    assert (edge.key, edge.bound, edge.value) == ("lr", "lower", 2e-3)
    middle = [({"lr": lr}, v) for lr, v in ((2e-3, 5.46), (4e-3, 5.41), (8e-3, 5.55))]
    assert find_edges(middle, {"lr": swept_range([2e-3, 4e-3, 8e-3])}) == []


def _grid(root, best_lr: float):
    """A sweep over lr 2e-3, 4e-3, 8e-3, 2 seeds, AdamW, the final loss lowest at best_lr."""
    root.mkdir(parents=True)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    job = 0
    for lr in (2e-3, 4e-3, 8e-3):
        for seed in (1, 2):
            cfg = config(**{"optimizer": {"name": "adamw", "lr": lr}, "train.seed": seed})
            offset = 0.1 * abs(math.log2(lr / best_lr)) + 0.01 * seed
            write_run(root / str(job), cfg, [f"optimizer.lr={lr}", f"train.seed={seed}"], power_law, offset)
            job += 1
    return root


def test_report_py_edges_names_the_bound_on_a_grid(tmp_path, capsys):
    from mars.analysis.cli import report_main

    assert report_main([str(_grid(tmp_path / "low", 1e-3)), "--edges", "--out", str(tmp_path / "r1")]) == 0
    out = capsys.readouterr().out
    assert "AdamW: optimizer.lr swept over 0.002, 0.004, 0.008" in out
    assert "edge: AdamW: the best optimizer.lr found, 0.002, sits at the lower bound" in out
    assert "Edges of the swept ranges:" in (tmp_path / "r1" / "report.md").read_text()


@pytest.mark.parametrize(
    ("best_lr", "expected"), [(1e-3, [("lower", 2e-3)]), (4e-3, []), (2e-2, [("upper", 8e-3)])]
)
def test_each_optimizer_of_a_sweep_is_an_arm(tmp_path, best_lr, expected):
    from mars.analysis.edges import sweep_edges
    from mars.analysis.runs import load_runs

    edges, checked = sweep_edges(load_runs([_grid(tmp_path / "g", best_lr)]), metric_of("val/loss"))
    assert [(e.arm, e.key) for e in edges] == [("AdamW", "optimizer.lr")] * len(expected)
    assert [(e.bound, e.value) for e in edges] == expected
    assert len(checked) == 1 and len(EVAL_TOKENS) > 4  # one arm, one key; curves long enough to fit
