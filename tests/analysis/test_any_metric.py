"""Any logged metric in report, plots and summary: the run table, the direction rules, --metric and
--direction, and the one metrics.jsonl reader the trainer and the analysis share."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from analysis_helpers import (
    BASE_OFFSETS,
    EVAL_TOKENS,
    GROUP_OFFSETS,
    TOKENS_PER_STEP,
    config,
    power_law,
    two_group_sweep,
    write_records,
)

import mars.metrics_jsonl as fmt
from mars.analysis.cli import plot_curves_main, report_main, summarize_main
from mars.analysis.metric import metric_of
from mars.analysis.plots import curves_figure, pyplot
from mars.analysis.report import build_report, comparison_table, markdown_table
from mars.analysis.runs import load_run

FINAL = EVAL_TOKENS[-1]
ACC = "downstream/hellaswag/acc"


# ----------------------------------------------------------------------------- metrics.jsonl


def test_trainer_and_analysis_share_one_metrics_jsonl_reader_and_encoder(tmp_path):
    from mars.analysis import runs
    from mars.train import metrics as train_metrics

    assert train_metrics.read_metrics is fmt.read_metrics is runs.read_metrics
    assert train_metrics.METRICS_FILE == runs.METRICS == "metrics.jsonl"
    f = train_metrics.MetricsFile(tmp_path)
    f.write({"step": 1, "tokens": 8, "train/loss": np.float32(2.5), "mars/grad_cos": float("nan")})
    f.write({"step": 2, "tokens": 16, "val/loss": float("inf"), "note": "text", "flag": True})
    f.close()
    (tmp_path / "metrics.jsonl").open("a").write('{"step": 3, "tok')  # killed mid-line
    assert "NaN" not in (tmp_path / "metrics.jsonl").read_text()  # strict JSON
    assert [r["step"] for r in fmt.read_metrics(tmp_path)] == [1, 2]
    run = load_run(tmp_path)
    assert run.keys == ["mars/grad_cos", "train/loss", "val/loss"]  # numbers only; step/tokens/time are axes
    assert math.isnan(run.final("mars/grad_cos")) and run.final("val/loss") == math.inf
    assert run.points("mars/grad_cos") == []  # finite values only; final() keeps the nan
    ((tokens, seconds, loss),) = run.train  # no "time" on the line: nan
    assert (tokens, loss) == (8.0, 2.5) and math.isnan(seconds)
    assert (run.last_step, run.last_tokens) == (2, 16.0)


def test_analysis_refuses_a_run_dir_with_a_damaged_line_in_one_line(tmp_path):
    from mars.analysis import UserError

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "tokens": 8, "val/loss": 3.0}\n{"ste\n{"step": 2')
    with pytest.raises(UserError) as e:  # a torn last line alone is fine, a damaged one before it is not
        load_run(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'metrics.jsonl'} line 2 is not a JSON object")
    assert "\n" not in str(e.value)


def test_jsonable_is_one_encoding_for_metrics_and_reports():
    value = {"a": np.float64(-math.inf), "b": [np.int64(3), (math.nan, 1.5)], "c": None}
    assert fmt.jsonable(value) == {"a": "-inf", "b": [3, ["nan", 1.5]], "c": None}
    assert json.loads(fmt.encode_line({"x": math.nan})) == {"x": "nan"}
    assert fmt.to_float("-inf") == -math.inf and fmt.to_float("x") is None and fmt.to_float(True) is None


def test_the_analysis_package_imports_without_torch(tmp_path):
    write_records(tmp_path / "run", config(), [], [{"step": 1, "tokens": 8, "val/loss": 3.0}])
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import mars.analysis, mars.analysis.cli, mars.metrics_jsonl, mars.train.metrics\n"
        "from mars.analysis.runs import load_run\n"
        f"print(load_run(__import__('pathlib').Path({str(tmp_path / 'run')!r})).final('val/loss'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "3.0"


# ----------------------------------------------------------------------------- directions


@pytest.mark.parametrize(
    ("key", "higher", "why"),
    [
        ("val/loss", False, "by name: *loss*"),
        ("train/loss", False, "by name: *loss*"),
        ("downstream/hellaswag/acc", True, "by name: acc*"),
        ("downstream/arc_easy/acc_norm", True, "by name: acc*"),
        ("downstream/gsm8k/exact_match,strict-match", True, "by name: exact_match*"),
        ("downstream/wikitext/word_perplexity", False, "by name: *perplexity*"),
        ("mfu", True, "by name: mfu"),
        ("mars/grad_cos", False, "the default for a key no rule names"),
    ],
)
def test_the_direction_of_a_metric_comes_from_one_rule_table(key, higher, why):
    m = metric_of(key)
    assert (m.higher_is_better, m.why) == (higher, why)
    flipped = metric_of(key, "lower" if higher else "higher")
    assert flipped.higher_is_better != higher and flipped.why == "--direction"


# ----------------------------------------------------------------------------- report


def test_report_on_train_loss_has_the_same_known_speedups(tmp_path):
    """train loss = val loss + 0.05 in the synthetic runs: the same factor-2 speedups."""
    report = build_report([two_group_sweep(tmp_path / "sweep")], metric="train/loss")
    base, mars = report.groups
    assert report.target == pytest.approx(power_law(FINAL) + 0.05)
    assert mars.speedup == pytest.approx(2.0, rel=1e-9) and report.fit.c == pytest.approx(2.05, rel=1e-4)
    assert mars.effective_speedup == pytest.approx(2.0, rel=1e-3)
    assert markdown_table(report).startswith("| optimizer | seeds | final train loss | best train loss |")
    assert [p.key for p in report.panels] == ["train/loss", "val/loss"]


def accuracy_sweep(root, slope_of_group=2.0):
    """-m optimizer=adamw,mars_adamw train.seed=1,2,3 with an in-loop downstream accuracy that rises
    linearly in tokens; MARS-AdamW's rises twice as fast. Val loss is logged too."""
    (root / "multirun.yaml").parent.mkdir(parents=True)
    (root / "multirun.yaml").write_text("{}\n")
    job = 0
    for name, slope, offsets in (("adamw", 1.0, BASE_OFFSETS), ("mars_adamw", slope_of_group, GROUP_OFFSETS)):
        for seed, offset in zip((1, 2, 3), offsets, strict=True):
            cfg = config(**{"optimizer.name": name, "train.seed": seed})
            records = [
                {"step": d // TOKENS_PER_STEP, "tokens": d, ACC: 0.25 + 0.1 * slope * d / FINAL + offset}
                for d in EVAL_TOKENS
            ]
            records += [
                {"step": d // TOKENS_PER_STEP, "tokens": d, "val/loss": power_law(d)} for d in EVAL_TOKENS
            ]
            write_records(root / str(job), cfg, [f"optimizer={name}", f"train.seed={seed}"], records)
            job += 1
    return root


def test_report_on_an_accuracy_where_higher_is_better(tmp_path, capsys):
    sweep = accuracy_sweep(tmp_path / "sweep")
    report = build_report([sweep], metric=ACC, baseline=["optimizer=adamw"])
    base, mars = report.groups
    assert report.metric.higher_is_better and report.target == pytest.approx(0.35)
    assert base.best[0] == pytest.approx(0.35) and mars.final[0] == pytest.approx(0.45)  # best = highest
    # the group gets to the baseline's final accuracy at half the tokens (linear curves: exact)
    assert mars.tokens_to_target_curve == pytest.approx(FINAL / 2) and mars.speedup == pytest.approx(2.0)
    assert mars.effective_speedup is None and "only for metrics where lower is better" in mars.effective_note
    assert mars.comparison.difference == pytest.approx(0.1) and "| better |" in comparison_table(report)
    # --direction turns it into a metric where lower is better: the same difference is now worse
    lower = build_report([sweep], metric=ACC, baseline=["optimizer=adamw"], direction="lower")
    assert "| worse |" in comparison_table(lower) and lower.groups[1].speedup is None
    assert report_main([str(sweep), "--metric", ACC, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert f"Metric: {ACC} (higher is better; by name: acc*)" in out
    assert "| optimizer | seeds | final downstream/hellaswag/acc | best downstream/hellaswag/acc |" in out
    assert [p.key for p in report.panels] == [ACC]  # no train loss logged: no empty panel
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["metric"] == {"key": ACC, "higher_is_better": True, "direction_from": "by name: acc*"}
    assert "final_val_loss" not in data["groups"][0] and data["groups"][1]["final"]["mean"] == pytest.approx(
        0.45
    )


def test_best_baseline_follows_the_metric_direction(tmp_path):
    sweep = accuracy_sweep(tmp_path / "sweep")
    # both groups match optimizer.weight_decay=0.01; --best takes the highest mean final accuracy
    report = build_report([sweep], metric=ACC, baseline=["optimizer.weight_decay=0.01"], best=True)
    assert report.groups[report.baseline].label == "MARS-AdamW (approx)"
    assert "the highest mean final downstream/hellaswag/acc of the 2 matching groups" in report.baseline_note


def test_a_metric_no_run_logged_is_one_line_naming_what_was_logged(tmp_path, capsys):
    sweep = two_group_sweep(tmp_path / "sweep")
    assert report_main([str(sweep), "--metric", "val/los"]) == 2
    err = capsys.readouterr().err.strip()
    logged = "grad_norm, lr, train/loss, val/loss"
    assert err == f"error: no run logged val/los (logged: {logged}): choose one with --metric KEY"
    with pytest.raises(SystemExit):  # argparse refuses it, in its usual way
        report_main([str(sweep), "--metric", "lr", "--direction", "sideways"])
    assert "invalid choice: 'sideways'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- plots and summary


def test_plot_curves_draws_any_logged_metric(tmp_path, capsys):
    sweep = accuracy_sweep(tmp_path / "sweep")
    out = tmp_path / "acc.png"
    assert plot_curves_main([str(sweep), "--metric", ACC, "--metric", "val/loss", "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000 and out.with_suffix(".pdf").is_file()
    runs = [load_run(sweep / str(i)) for i in range(6)]
    for r, text in zip(runs, "abcdef", strict=True):
        r.label = text
    fig = curves_figure(runs, metrics=[ACC])
    (ax,) = fig.axes  # one metric, no times logged: one panel
    assert ax.get_ylabel() == ACC and len(ax.lines) == 6
    # higher is better: the first tenth of training (low accuracies) is left out of the y range's bottom
    bottom, top = ax.get_ylim()
    full = curves_figure(runs, metrics=[ACC], full_range=True).axes[0].get_ylim()
    assert full[0] < 0.23 < bottom < 0.25 and top > 0.465  # early accuracies: 0.23 at 0 tokens
    pyplot().close("all")
    assert plot_curves_main([str(sweep), "--metric", "mars/grad_cos", "--out", str(out)]) == 2
    assert (
        "error: no input logged mars/grad_cos (logged: downstream/hellaswag/acc, val/loss)"
        in capsys.readouterr().err
    )


def test_wandb_exports_keep_every_metric_column(tmp_path):
    from mars.analysis.wandb_csv import read_wandb_csv

    csv = tmp_path / "history.csv"
    csv.write_text(
        "_step,_runtime,train/loss,mars/grad_cos,tokens\n10,5,4.0,0.5,10240\n20,10,3.5,0.25,20480\n"
    )
    (run,) = read_wandb_csv(csv, tokens_per_step=1)
    assert run.keys == ["mars/grad_cos", "train/loss"] and run.points("mars/grad_cos") == [
        (10240.0, 5.0, 0.5),
        (20480.0, 10.0, 0.25),
    ]
    out = tmp_path / "cos.png"
    assert plot_curves_main([str(csv), "--metric", "mars/grad_cos", "--out", str(out)]) == 0 and out.is_file()


def test_summarize_sweep_adds_any_metric_and_orders_by_its_direction(tmp_path, capsys):
    sweep = accuracy_sweep(tmp_path / "sweep")
    assert summarize_main([str(sweep), "--metric", ACC]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-4:] == ["final", ACC, "best", ACC]
    first = lines[2].split()
    assert first[:2] == ["mars_adamw", "3"] and first[-2:] == ["0.4650", "0.4650"]  # highest accuracy first
    header = (sweep / "summary.csv").read_text().splitlines()[0]
    assert header.endswith(f"tokens,final {ACC},best {ACC},run_dir")
    assert summarize_main([str(sweep), "--metric", "nope"]) == 2
    assert "error: no job under" in capsys.readouterr().err
