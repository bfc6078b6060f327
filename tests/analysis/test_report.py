"""scripts/report.py and mars.analysis.report on synthetic sweeps whose answers are known exactly.

The baseline (AdamW) follows L(D) = 2 + 5 D^-0.3 and the other group (MARS-AdamW) L(2D): it needs
half the tokens for any loss, so every speedup is 2. Seeds add offsets that average to zero.
"""

from __future__ import annotations

import json
import statistics

import pytest
from analysis_helpers import (
    BASE_OFFSETS,
    DELTA,
    EVAL_TOKENS,
    GROUP_OFFSETS,
    MAX_STEPS,
    A,
    B,
    C,
    config,
    power_law,
    shifted,
    two_group_sweep,
    write_run,
)
from test_stats import welch_by_hand

from mars.analysis.cli import report_main
from mars.analysis.report import build_report, markdown_table
from mars.metrics_jsonl import read_metrics

FINAL = EVAL_TOKENS[-1]  # 20 evaluations of DELTA tokens


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return two_group_sweep(tmp_path_factory.mktemp("report") / "sweep")


def test_default_report_compares_to_the_first_group_with_known_numbers(sweep):
    report = build_report([sweep])
    base, mars = report.groups
    assert report.baseline == 0 and base.baseline and base.label == "AdamW"
    assert "first group in sorted order" in report.baseline_note
    assert mars.label == "MARS-AdamW (approx)" and report.common == "GPT-2 tiny"
    assert [r.seed for r in base.runs] == [1, 2, 3] and [r.data_seed for r in base.runs] == [1, 2, 3]
    # target: the baseline's mean final val loss (its offsets average to zero)
    assert report.target == pytest.approx(power_law(FINAL), rel=1e-12)
    assert base.final == (pytest.approx(power_law(FINAL)), pytest.approx(statistics.stdev(BASE_OFFSETS)))
    # the baseline's mean curve reaches its own mean final loss at its last evaluation; MARS at half of it
    assert base.tokens_to_target_curve == pytest.approx(FINAL, rel=1e-9)
    assert mars.tokens_to_target_curve == pytest.approx(FINAL / 2, rel=1e-9)
    assert base.speedup == pytest.approx(1.0) and mars.speedup == pytest.approx(2.0, rel=1e-9)
    # the fit on the baseline's mean curve is the power law itself
    fit = report.fit
    assert (fit.a, fit.b, fit.c) == (
        pytest.approx(A, rel=1e-4),
        pytest.approx(B, rel=1e-4),
        pytest.approx(C, rel=1e-5),
    )
    # MARS's final loss is the baseline's at twice its tokens: D_eff = 2 x, beyond what the fit saw
    assert mars.effective_tokens == pytest.approx(2 * FINAL, rel=1e-4)
    assert mars.effective_speedup == pytest.approx(2.0, rel=1e-4) and mars.extrapolated
    assert base.effective_speedup == pytest.approx(1.0, rel=1e-4) and not base.extrapolated
    # Welch's test of the final losses against the baseline's
    t, df, p = welch_by_hand(
        [shifted(FINAL) + o for o in GROUP_OFFSETS], [power_law(FINAL) + o for o in BASE_OFFSETS]
    )
    assert (mars.welch.t, mars.welch.df, mars.welch.p) == (
        pytest.approx(t, rel=1e-9),
        pytest.approx(df, rel=1e-9),
        pytest.approx(p, rel=1e-7),
    )
    assert base.welch is None and base.welch_note == "baseline"


def test_tokens_to_target_per_run_is_interpolated_between_evaluations(sweep):
    target = power_law(10 * DELTA)
    report = build_report([sweep], target=target)
    base, mars = report.groups
    assert report.target_note == "--target"
    assert base.runs[1].tokens_to_target == pytest.approx(10 * DELTA, rel=1e-9)  # offset 0: at an evaluation
    for group, curve, offsets in ((base, power_law, BASE_OFFSETS), (mars, shifted, GROUP_OFFSETS)):
        assert len(group.reached) == 3
        for run, offset in zip(group.runs, offsets, strict=True):
            d = run.tokens_to_target
            lo = int(d // DELTA) * DELTA  # the evaluations around the crossing
            hi = lo + DELTA if d > lo else lo
            l_lo, l_hi = curve(lo) + offset, curve(hi) + offset
            if hi > lo:  # on the straight line between them, past the last evaluation above the target
                assert l_lo > target >= l_hi
                assert (d - lo) / DELTA == pytest.approx((l_lo - target) / (l_lo - l_hi), rel=1e-9)
            else:
                assert l_lo <= target < curve(lo - DELTA) + offset
    assert base.reached[0] < base.reached[1] < base.reached[2]  # lower offset, earlier
    assert mars.tokens_to_target_curve == pytest.approx(5 * DELTA, rel=1e-9)
    assert mars.speedup == pytest.approx(2.0, rel=1e-9)


def test_runs_that_never_reach_the_target_are_counted_not_averaged(sweep):
    report = build_report([sweep], target=2.11)  # below every AdamW seed; above one MARS seed
    base, mars = report.groups
    assert base.reached == [] and base.speedup is None
    assert [r.tokens_to_target is None for r in mars.runs] == [False, False, True]
    assert mars.speedup is None and mars.speedup_note == "the baseline does not reach the target"
    table = markdown_table(report)
    assert (
        "| 0/3 |" in table and "| 2/3 |" in table and "n/a (the baseline does not reach the target)" in table
    )


def test_baseline_by_config_key_or_override(sweep):
    report = build_report([sweep], baseline=["optimizer.name=mars_adamw"])
    assert report.baseline == 1 and report.groups[1].baseline
    # AdamW never gets down to MARS's final loss; to MARS's loss at half its run it takes twice the tokens
    assert report.groups[0].speedup is None and report.groups[0].speedup_note == "does not reach the target"
    slower = build_report([sweep], baseline=["optimizer.name=mars_adamw"], target=shifted(FINAL / 2))
    assert slower.groups[0].speedup == pytest.approx(0.5, rel=1e-9)
    assert "(--baseline optimizer.name=mars_adamw)" in report.baseline_note
    assert build_report([sweep], baseline=["optimizer=mars_adamw"]).baseline == 1  # the override's spelling
    assert build_report([sweep], baseline=["optimizer.lr=6e-4"]).baseline == 0  # 6e-4 == 0.0006


def test_cli_writes_markdown_json_and_figures_and_prints_the_table(sweep, tmp_path, capsys):
    out = tmp_path / "out"
    assert report_main([str(sweep), "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    table = stdout[stdout.index("| optimizer |") :].split("\n\n")[0].splitlines()
    assert table[0].startswith("| optimizer | seeds | final val loss | best val loss | reached target |")
    assert table[2].startswith("| **AdamW** | 3 | 2.1275 ± 0.0100 |") and "| 1.00x (baseline) |" in table[2]
    assert (
        table[3].startswith("| MARS-AdamW (approx) | 3 | 2.1036 ± 0.0180 |")
        and "| 2.00x | 2.00x* |" in table[3]
    )
    md = (out / "report.md").read_text()
    assert (
        "\n".join(table) in md
        and "a = 5, b = 0.3, c = 2" in md
        and "![report_curves](report_curves.png)" in md
    )
    data = json.loads((out / "report.json").read_text())
    assert data["baseline"]["label"] == "AdamW" and data["target"]["loss"] == pytest.approx(power_law(FINAL))
    assert data["fit"]["b"] == pytest.approx(B, rel=1e-4)
    mars = data["groups"][1]
    assert mars["speedup"] == pytest.approx(2.0) and mars["effective_data"]["extrapolated"] is True
    assert [r["seed"] for r in mars["runs"]] == [1, 2, 3] and mars["runs"][0]["path"].endswith("3")
    assert mars["welch"]["p"] == pytest.approx(data["groups"][1]["welch"]["p"]) and mars["welch"]["df"] > 2
    assert (out / "report_curves.png").stat().st_size > 30_000 and (
        out / "report_curves.pdf"
    ).stat().st_size > 5_000
    assert not (out / "report_heatmap.png").exists()  # one key varies: no heatmap
    assert not (sweep / "report.md").exists()  # --out wins over the sweep dir


def test_two_swept_keys_get_a_heatmap_and_runs_of_one_setting_are_pooled(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("{}\n")
    job = 0
    for lr in (0.003, 0.006):
        for gamma in (0.0, 0.025):
            for seed in (1, 2):
                cfg = config(**{"optimizer.lr": lr, "optimizer.gamma": gamma, "train.seed": seed})
                cfg["train"]["device"] = "cuda" if seed == 1 else "cpu"  # bookkeeping: does not split groups
                over = [f"optimizer.lr={lr}", f"optimizer.gamma={gamma}", f"train.seed={seed}"]
                write_run(
                    sweep / str(job),
                    cfg,
                    over,
                    lambda d, f=1 + 100 * lr + 10 * gamma: power_law(f * d),
                    0.01 * seed,
                )
                job += 1
    report = build_report([sweep], baseline=["optimizer.gamma=0", "optimizer.lr=0.003"])
    assert [c.header for c in report.columns] == ["gamma", "lr"]
    assert [g.label for g in report.groups] == [
        "gamma=0.0, lr=0.003",
        "gamma=0.0, lr=0.006",
        "gamma=0.025, lr=0.003",
        "gamma=0.025, lr=0.006",
    ]
    assert [g.n for g in report.groups] == [2, 2, 2, 2] and report.baseline == 0
    assert report_main([str(sweep)]) == 0
    assert (sweep / "report_heatmap.png").stat().st_size > 20_000 and (sweep / "report.md").is_file()


def test_a_swept_max_steps_is_reported(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("{}\n")
    for job, steps in enumerate((100, 100, 200, 200)):
        cfg = config(**{"train.max_steps": steps, "train.seed": job % 2})
        tokens = [d for d in EVAL_TOKENS if d <= steps * 1024]
        write_run(
            sweep / str(job), cfg, [f"train.max_steps={steps}", f"train.seed={job % 2}"], power_law, 0, tokens
        )
    report = build_report([sweep])
    assert [c.key for c in report.columns] == ["train.max_steps"]
    assert [g.label for g in report.groups] == ["max_steps=100", "max_steps=200"]
    assert report.groups[1].speedup == pytest.approx(1.0)  # the same curve, only longer
    assert report.groups[1].effective_speedup == pytest.approx(1.0, rel=1e-3)


def test_killed_duplicated_and_diverged_runs_are_warned_about(tmp_path):
    write_run(tmp_path / "0", config(**{"train.seed": 1}), ["train.seed=1"], power_law)
    write_run(tmp_path / "1", config(**{"train.seed": 1}), ["train.seed=1"], power_law)  # the same run again
    write_run(tmp_path / "2", config(**{"train.seed": 2}), ["train.seed=2"], power_law, 0, EVAL_TOKENS[:11])
    write_run(
        tmp_path / "3",
        config(**{"train.seed": 3}),
        ["train.seed=3"],
        lambda d: float("nan") if d > 5e4 else 9.0,
    )
    report = build_report([tmp_path], target=2.5)
    (group,) = report.groups
    assert group.n == 4 and group.label == "" and report.columns == []
    assert [r.final_tokens for r in group.runs] == [FINAL, FINAL, EVAL_TOKENS[10], FINAL]
    warnings = "\n".join(report.warnings)
    assert "2 runs with train.seed=1, data seed 1 (the same run twice is not two seeds)" in warnings
    assert f"{tmp_path / '2'} stopped early (killed?)" in warnings
    assert f"{tmp_path / '3'}: final val loss is nan (diverged?)" in warnings
    assert "| **all runs** | 4 | nan |" in markdown_table(report)  # a divergence is not averaged away


def lr_sweep(root, extend=None, lrs=("3e-3", "6e-3")):
    """`-m optimizer.lr=3e-3,6e-3 train.seed=1,2,3` of MAX_STEPS steps; job `extend` then continued to
    twice as many with train.resume=auto train.max_steps=... (docs/training.md), its lines of the first
    MAX_STEPS steps those it logged as one of the sweep."""
    root.mkdir(parents=True)
    (root / "multirun.yaml").write_text("{}\n")
    job = 0
    for lr in lrs:
        for seed in (1, 2, 3):
            over, steps = [f"optimizer.lr={lr}", f"train.seed={seed}"], MAX_STEPS
            tokens = EVAL_TOKENS
            if job == extend:
                steps, over = 2 * MAX_STEPS, [*over, "train.resume=auto", f"train.max_steps={2 * MAX_STEPS}"]
                tokens = [i * DELTA for i in range(2 * len(EVAL_TOKENS) - 1)]
            cfg = config(**{"optimizer.lr": float(lr), "train.seed": seed, "train.max_steps": steps})
            write_run(root / str(job), cfg, over, power_law, 0.01 * seed + float(lr), tokens)
            job += 1
    return root


def test_a_run_trained_on_is_compared_with_its_sweep_at_the_sweep_length(tmp_path):
    plain = build_report([lr_sweep(tmp_path / "plain")])
    report = build_report([lr_sweep(tmp_path / "sweep", extend=0)])
    assert [(g.label, g.n) for g in report.groups] == [("lr=0.003", 3), ("lr=0.006", 3)]
    extended = report.groups[0].runs[0]
    assert extended.path == str(tmp_path / "sweep" / "0")
    assert (extended.final, extended.final_tokens) == (plain.groups[0].runs[0].final, FINAL)  # at step 200
    assert [g.speedup for g in report.groups] == [g.speedup for g in plain.groups]
    assert report.warnings == [
        f"{tmp_path / 'sweep' / '0'} was trained on to train.max_steps=400; compared at step 200, its "
        "sweep's length (report it alone for the longer run)"
    ]
    alone = build_report([tmp_path / "sweep" / "0"])  # on its own: the whole run
    assert alone.groups[0].runs[0].final_tokens == 2 * FINAL and alone.warnings == []

    # continued before it reached step 200: its lr left its siblings' there, which the note says
    early = lr_sweep(tmp_path / "early", extend=3)
    records = read_metrics(early / "3")
    for r in records:
        if "lr" in r and r["step"] > 150:  # the longer schedule from its resume at step 150
            r["lr"] *= 2
    (early / "3" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (note,) = build_report([early]).warnings
    assert note.endswith("its lr differs from its siblings' before step 200: continued before it got there")


def test_one_number_format_in_labels_whatever_the_command_line_said(tmp_path):
    """optimizer.lr=3e-3 in one sweep and 0.003 in another are one value, shown one way."""
    lr_sweep(tmp_path / "a", lrs=("3e-3",))
    lr_sweep(tmp_path / "b", lrs=("0.003", "6e-3"))
    for run in (tmp_path / "b").iterdir():  # sweep b ran MARS-AdamW's lr on AdamW's other settings
        if run.is_dir():
            text = (run / ".hydra" / "config.yaml").read_text()
            (run / ".hydra" / "config.yaml").write_text(
                text.replace("weight_decay: 0.01", "weight_decay: 0.1")
            )
    report = build_report([tmp_path / "a", tmp_path / "b"])
    assert [g.label for g in report.groups] == [
        "lr=0.003, weight_decay=0.01",
        "lr=0.003, weight_decay=0.1",
        "lr=0.006, weight_decay=0.1",
    ]
