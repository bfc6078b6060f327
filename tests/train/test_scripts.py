"""scripts/summarize_sweep.py, plot_curves.py and bench_train.py's arguments (no training)."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import yaml
from train_helpers import REPO


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def fake_run(run_dir, overrides, val, train=(), cfg=None, tokens_per_step=1000):
    """A run dir as train.py leaves it: .hydra/{overrides,config}.yaml and metrics.jsonl."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg or {}))
    lines = [{"step": s, "tokens": s * tokens_per_step, "train/loss": v, "time": s * 2.0} for s, v in train]
    lines += [{"step": s, "tokens": s * tokens_per_step, "val/loss": v, "time": s * 2.0} for s, v in val]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_summarize_sweep_table_csv_and_heatmap(tmp_path, capsys):
    summarize = load_script("summarize_sweep")
    common = ["data.root=/x", "train.max_steps=3"]
    fake_run(tmp_path / "0", ["optimizer.gamma=0", "optimizer.lr=0.001", *common], [(0, 10.0), (3, 9.0)])
    fake_run(tmp_path / "1", ["optimizer.gamma=0", "optimizer.lr=0.003", *common], [(0, 10.0), (3, 8.0)])
    fake_run(tmp_path / "2", ["optimizer.gamma=0.025", "optimizer.lr=0.001", *common], [(0, 10.0), (3, 8.5)])
    fake_run(
        tmp_path / "3",
        ["optimizer.gamma=0.025", "optimizer.lr=0.003", *common],
        [(0, 10.0), (2, 7.0), (3, 7.5)],
    )
    assert summarize.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["optimizer.gamma", "optimizer.lr", *summarize.COLUMNS]
    assert out[2].split()[:4] == ["0.025", "0.003", "7.5000", "7.0000"]  # best first
    rows = list((tmp_path / "summary.csv").read_text().splitlines())
    assert rows[1].startswith("0,0.001,9.0,9.0,")
    assert (tmp_path / "summary_heatmap.png").stat().st_size > 10_000


def test_summarize_sweep_one_dimensional_has_no_heatmap(tmp_path):
    summarize = load_script("summarize_sweep")
    fake_run(tmp_path / "0", ["optimizer.lr=0.001"], [(5, 4.0)])
    fake_run(tmp_path / "1", ["optimizer.lr=0.002"], [])
    swept, rows = summarize.summarize(tmp_path)
    assert swept == ["optimizer.lr"]
    assert [r["best_val_loss"] for r in rows] == [4.0, None]
    assert summarize.main([str(tmp_path)]) == 0
    assert not (tmp_path / "summary_heatmap.png").exists()


PAPER_CFG = {
    "model": {"n_layer": 12, "n_head": 12, "n_embd": 768},
    "data": {"name": "openwebtext"},
    "optimizer": {"name": "mars_adamw", "approx": False, "lr": 6e-3},
}


def test_describe_labels_runs_and_matches_paper_presets():
    plot = load_script("plot_curves")
    label, paper = plot.describe(PAPER_CFG)
    assert label == "MARS-AdamW (exact), GPT-2 small, lr 0.006" and paper == ("MARS-exact", "small")
    tiny = {**PAPER_CFG, "model": {"n_layer": 4, "n_head": 4, "n_embd": 256}}
    assert plot.describe(tiny)[1] is None
    assert plot.describe({**PAPER_CFG, "data": {"name": "embedded"}})[1] is None
    assert plot.describe({**PAPER_CFG, "optimizer": {"name": "adamw", "lr": 6e-4}})[1] == ("AdamW", "small")


def test_wandb_csv_exports_are_read(tmp_path):
    plot = load_script("plot_curves")
    history = tmp_path / "history.csv"
    history.write_text("_step,_runtime,train/loss,val/loss,tokens\n10,5,4.0,,10240\n20,10,3.5,3.6,20480\n")
    (curve,) = plot.read_wandb_csv(history, tokens_per_step=1)
    assert curve.label == "history" and curve.train == [(10240, 5, 4.0), (20480, 10, 3.5)]
    assert curve.val == [(20480, 10, 3.6)]
    chart = tmp_path / "chart.csv"
    chart.write_text(
        "Step,runA - val/loss,runA - val/loss__MIN,runB - val/loss\n1000,3.2,3.1,3.3\n2000,3.0,2.9,\n"
    )
    curves = {c.label: c for c in plot.read_wandb_csv(chart, tokens_per_step=491520)}
    assert curves["runA"].val == [
        (1000 * 491520, pytest.approx(float("nan"), nan_ok=True), 3.2),
        (2000 * 491520, pytest.approx(float("nan"), nan_ok=True), 3.0),
    ]
    assert [p[2] for p in curves["runB"].val] == [3.3]


def test_plot_curves_writes_png_and_pdf_with_paper_markers(tmp_path):
    plot = load_script("plot_curves")
    tps = 480 * 1024
    steps = range(0, 100001, 5000)
    fake_run(
        tmp_path / "a",
        [],
        [(s, 3.5 - s / 1e5) for s in steps],
        [(s, 3.6 - s / 1e5) for s in steps if s],
        cfg=PAPER_CFG,
        tokens_per_step=tps,
    )
    fake_run(
        tmp_path / "b",
        [],
        [(s, 3.6 - s / 1e5) for s in steps],
        [(s, 3.7 - s / 1e5) for s in steps if s],
        cfg={**PAPER_CFG, "optimizer": {"name": "adamw", "lr": 6e-4}},
        tokens_per_step=tps,
    )
    out = tmp_path / "fig" / "owt.png"
    assert (
        plot.main(
            [
                str(tmp_path / "a"),
                str(tmp_path / "b"),
                "--out",
                str(out),
                "--zoom",
                "20",
                "50",
                "2.5",
                "3.2",
                "--smooth",
                "3",
                "--title",
                "GPT-2 small",
            ]
        )
        == 0
    )
    assert out.stat().st_size > 50_000 and out.with_suffix(".pdf").stat().st_size > 10_000
    curve = plot.read_run(tmp_path / "a")
    assert curve.paper_key == ("MARS-exact", "small") and len(curve.val) == 21


def test_identical_configs_get_their_run_dir_in_the_legend(tmp_path):
    plot = load_script("plot_curves")
    curves = [
        plot.Curve(label="MARS-AdamW (approx)"),
        plot.Curve(label="MARS-AdamW (approx)"),
        plot.Curve(label="AdamW"),
    ]
    dirs = [tmp_path / "run_a", tmp_path / "run_b", tmp_path / "run_c"]
    plot.disambiguate(curves, dirs)
    assert [c.label for c in curves] == [
        "MARS-AdamW (approx) [run_a]",
        "MARS-AdamW (approx) [run_b]",
        "AdamW",
    ]


def test_bench_train_takes_the_layout_as_an_override_too():
    """`bench_train.py train.parallel=fsdp` measures fsdp (in a process group, as --parallel does)
    instead of handing the override to a trainer that has no group."""
    bench = load_script("bench_train")
    args = bench.parse_args(["train.parallel=fsdp", "data.root=/d"])
    assert args.parallel == ["fsdp"] and args.overrides == ["data.root=/d"]
    assert bench.parse_args(["--parallel", "ddp", "fsdp"]).parallel == ["ddp", "fsdp"]
    with pytest.raises(SystemExit):
        bench.parse_args(["train.parallel=zero"])


def test_the_benchmarks_measure_what_averaged_weights_cost(data_root, tmp_path, one_thread):
    """bench_train.py --average: a row per optimizer with train.average, its split and its 4 bytes per
    parameter of float32 averaged weights; bench_optim.py's average_ema row: the update alone."""
    import torch

    from mars.model import GPT, GPTConfig

    bench = load_script("bench_train")
    overrides = [f"data.root={data_root}", "model.n_layer=1", "model.n_embd=32", "model.block_size=32",
                 "train.batch_size=2", "train.global_batch_size=2", "train.eval_steps=0", "logger=disabled",
                 "train.progress=false", "train.device=cpu"]  # fmt: skip
    plain = bench.bench_one("adamw", overrides, 2, 1, tmp_path)
    averaged = bench.bench_one("adamw", [*overrides, "train.average=ema"], 2, 1, tmp_path)
    assert (plain["name"], plain["average"], plain["average_bytes_per_param"]) == ("adamw", None, 0.0)
    assert (averaged["name"], averaged["average"]) == ("adamw+ema", "ema")
    assert averaged["average_bytes_per_param"] == 4.0 and averaged["ms_optimizer"] > 0
    assert averaged["ms_forward_backward"] > 0
    optim = load_script("bench_optim")
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=64))
    n = sum(p.numel() for p in model.parameters())
    row = optim.time_row("average_ema", model, n, steps=2, warmup=1, device=torch.device("cpu"))
    assert row["state_bytes_per_param"] == 4.0 and row["ms_per_step"] > 0
