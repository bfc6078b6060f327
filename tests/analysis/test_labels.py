"""Grouping, labels and figure layout: what a row or a legend entry says, and where the legend goes."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_helpers import ADAMW, BASE_CONFIG, config, power_law, write_run

from mars.analysis.groups import group_runs
from mars.analysis.labels import Item, common_description, label, read_run, run_labels, varying_columns
from mars.analysis.plots import GroupCurves, curves_figure, groups_figure, pyplot
from mars.analysis.runs import load_runs, parse_overrides
from mars.analysis.settings import settings_of
from mars.analysis.stats import mean_curve


def item(cfg: dict, overrides: list[str] = ()) -> Item:
    from mars.analysis.runs import flatten

    return Item(settings_of(flatten(cfg)), parse_overrides(list(overrides)))


def labels_of(items: list[Item]) -> list[str]:
    return [label(varying_columns(items), it) for it in items]


def test_runs_differing_only_in_seeds_and_bookkeeping_are_one_group(tmp_path):
    base = {"train.seed": 1, "data.root": "/a", "train.device": "cuda", "logger.wandb.mode": "online"}
    write_run(tmp_path / "0", config(**base), ["train.seed=1"], power_law)
    moved = {
        "train.seed": 2,
        "train.data_seed": 7,
        "data.root": "/b",
        "train.device": "cpu",
        "train.resume": "auto",
    }
    write_run(
        tmp_path / "1", config(**moved, **{"logger.wandb.mode": "disabled"}), ["train.seed=2"], power_law
    )
    write_run(tmp_path / "2", config(**{"schedule.warmup_steps": 20}), [], power_law)  # a setting
    groups = group_runs(load_runs([tmp_path]))
    assert [[r.path.name for r in g.runs] for g in groups] == [["0", "1"], ["2"]]
    assert labels_of([g.item for g in groups]) == ["warmup_steps=10", "warmup_steps=20"]


def test_keys_an_optimizer_does_not_read_neither_split_groups_nor_appear_in_labels(tmp_path):
    old = {**BASE_CONFIG["optimizer"], **ADAMW}  # an AdamW config that still carries gamma and lr_1d
    write_run(tmp_path / "0", config(optimizer={**old, "gamma": 0.0}), ["optimizer=adamw"], power_law)
    write_run(tmp_path / "1", config(optimizer={**old, "gamma": 0.05}), ["optimizer=adamw"], power_law)
    runs = load_runs([tmp_path])
    assert len(group_runs(runs)) == 1
    items = [
        item(
            config(optimizer={**old, "lr": 1e-3}),
            ["optimizer=adamw", "optimizer.gamma=0.1", "optimizer.lr=1e-3"],
        ),
        item(config(**{"optimizer.gamma": 0.05}), ["optimizer=mars_adamw", "optimizer.gamma=0.05"]),
        item(
            config(**{"optimizer.gamma": 0.1, "optimizer.lr": 1e-3}),
            ["optimizer.gamma=0.1", "optimizer.lr=1e-3"],
        ),
    ]
    assert labels_of(items) == [
        "AdamW, lr=0.001",  # the override said 1e-3: one number format for every label
        "MARS-AdamW (approx), gamma=0.05, lr=0.006",
        "MARS-AdamW (approx), gamma=0.1, lr=0.001",
    ]


def test_labels_name_only_what_differs_and_prefer_the_overrides():
    adamw = config(optimizer=ADAMW)
    mars = config()
    # differences that come with the optimizer (betas, weight decay, lr) are implied by its name
    assert labels_of([item(adamw), item(mars)]) == ["AdamW", "MARS-AdamW (approx)"]
    assert common_description(varying_columns([item(adamw), item(mars)]), [item(adamw)]) == "GPT-2 tiny"
    # a config group choice explains every key that changed with it
    wsd = config(**{"schedule.name": "wsd", "schedule.decay_fraction": 0.2})
    items = [item(mars, ["schedule=cosine"]), item(wsd, ["schedule=wsd"])]
    assert [c.key for c in varying_columns(items)] == ["schedule"]
    assert labels_of(items) == ["schedule=cosine", "schedule=wsd"]
    # a difference no override explains is named by its config key, as short as is unambiguous
    before = config(**{"train.grad_clip": 1.0, "data.seed": 1337})
    items = [item(before), item(config(**{"train.grad_clip": 0.5, "data.seed": 3, "train.seed": 9}))]
    assert labels_of(items) == ["data.seed=1337, grad_clip=1.0", "data.seed=3, grad_clip=0.5"]
    assert labels_of([item(mars)]) == [""]  # alone: nothing differs


def test_plot_curves_labels_name_the_differing_keys_seeds_included(tmp_path):
    write_run(tmp_path / "a", config(**{"train.seed": 1}), ["train.seed=1"], power_law)
    write_run(tmp_path / "b", config(**{"train.seed": 2}), ["train.seed=2"], power_law)
    write_run(
        tmp_path / "c",
        config(optimizer={**BASE_CONFIG["optimizer"], **ADAMW}),
        ["optimizer=adamw"],
        power_law,
    )
    labels, common = run_labels([tmp_path / "a", tmp_path / "b"])
    assert labels == ["seed=1", "seed=2"] and common == "MARS-AdamW (approx), GPT-2 tiny"
    labels, common = run_labels([tmp_path / "a", tmp_path / "c"])
    assert labels == ["MARS-AdamW (approx), seed=1", "AdamW, seed=1337"] and common == "GPT-2 tiny"
    assert run_labels([tmp_path / "c"]) == (["AdamW, GPT-2 tiny, lr 0.0006"], "")


def overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def assert_legend_clear_of_axes(fig) -> None:
    """The legend lies inside the figure and overlaps no axes, tick label or axis label."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    assert not any(ax.get_legend() for ax in fig.axes)  # no legend inside a panel
    for ax in fig.axes:
        assert not overlaps(box, ax.get_tightbbox(renderer)), ax.get_ylabel()
    page = fig.bbox  # constrained layout made room for it: nothing is cut off at the figure's edge
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    pyplot().close(fig)


@pytest.mark.parametrize("n_curves", [2, 9])
def test_plot_curves_legend_sits_outside_the_panels(tmp_path, n_curves):
    runs = []
    for i in range(n_curves):
        cfg = config(**{"optimizer.lr": 1e-3 * (i + 1), "optimizer.gamma": 0.0125 * i})
        runs.append(write_run(tmp_path / str(i), cfg, [], lambda d, f=1 + i / 5: power_law(f * d)))
    labels, common = run_labels(runs)
    curves = [read_run(r) for r in runs]
    for c, text in zip(curves, labels, strict=True):
        c.label = text
    fig = curves_figure(curves, zoom=(100, 200, 2.1, 2.2), legend_title=common)
    assert fig.legends[0].get_title().get_text() == "MARS-AdamW (approx), GPT-2 tiny"
    assert len(fig.legends[0].get_texts()) == n_curves
    assert_legend_clear_of_axes(fig)


def test_report_figure_legend_sits_outside_the_panels(tmp_path):
    groups = []
    for i in range(7):
        curve = [(d, power_law((1 + i / 4) * d)) for d in (0, 1e4, 2e4, 4e4, 8e4)]
        band = mean_curve([curve, [(d, v + 0.01) for d, v in curve]])
        groups.append(GroupCurves(f"optimizer.lr={i}e-3, optimizer.gamma=0.0{i}", [band, band], i == 0, 2))
    fig = groups_figure(groups, target=2.3)
    assert fig.legends[0].get_title().get_text() == "mean over seeds; shaded: min to max over seeds"
    assert_legend_clear_of_axes(fig)


def test_summarize_sweep_shares_the_library(tmp_path):
    import importlib.util
    import sys

    import mars.analysis.summary as summary

    path = Path(__file__).resolve().parents[2] / "scripts" / "summarize_sweep.py"
    spec = importlib.util.spec_from_file_location("summarize_sweep_shared", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    assert module.summarize is summary.summarize and module.COLUMNS is summary.COLUMNS
    write_run(tmp_path / "0", config(), ["optimizer.lr=0.001"], power_law, 0.0, [0, 100, 200])
    (tmp_path / "0" / "metrics.jsonl").write_text('{"step": 1, "tokens": 100, "val/loss": "nan"}\n')
    swept, rows = summary.summarize(tmp_path)
    assert rows[0]["best_val_loss"] is None  # a non-finite loss is no loss


def test_a_config_group_choice_stands_only_for_the_keys_it_determines():
    # two runs of preset a differ in lr: the experiment= column alone would give them one label
    a1 = item(config(**{"optimizer.lr": 1e-3}), ["experiment=a", "optimizer.lr=1e-3"])
    a2 = item(config(**{"optimizer.lr": 2e-3}), ["experiment=a", "optimizer.lr=2e-3"])
    b = item(config(**{"optimizer.lr": 1e-3, "schedule.warmup_steps": 2000}), ["experiment=b"])
    assert labels_of([a1, a2, b]) == [
        "lr=0.001, experiment=a",  # the same lr as b's, in the same form though a's came from 1e-3
        "lr=0.002, experiment=a",
        "lr=0.001, experiment=b",
    ]
    # a shape the size name does not tell apart keeps its own key
    narrow = {"model.n_layer": 2, "model.n_embd": 64}
    items = [item(config(**narrow, **{"model.n_head": h})) for h in (2, 4)]
    assert labels_of(items) == ["n_head=2", "n_head=4"]
    assert labels_of([item(config()), item(config(**narrow))]) == ["GPT-2 tiny", "2L/64d"]


def test_plot_curves_y_range_skips_the_first_tenth_of_training_unless_asked(tmp_path):
    curve = read_run(write_run(tmp_path / "a", config(), [], power_law))  # val loss 10 at step 0
    focused = curves_figure([curve]).axes[1].get_ylim()
    full = curves_figure([curve], full_range=True).axes[1].get_ylim()
    pyplot().close("all")
    assert focused[1] < power_law(0.1 * 204800) + 0.05 and full[1] > 10.0
    assert focused[0] < power_law(204800) < focused[1]


def llama(**changes) -> dict:
    """A llama_tiny run's config: the model section of configs/model/llama_tiny.yaml."""
    model = {"arch": "llama", "n_layer": 4, "n_head": 4, "n_kv_head": 2, "n_embd": 256, "block_size": 256,
             "vocab_size": 50304, "mlp_hidden": None, "multiple_of": 64, "norm_eps": 1e-5,
             "rope_theta": 10000.0, "tie_embeddings": False}  # fmt: skip
    cfg = config(**changes)
    cfg["model"] = {**model, **{k.split(".", 1)[1]: v for k, v in changes.items() if k.startswith("model.")}}
    return cfg


def test_labels_name_the_architecture_and_its_own_keys_only_where_they_vary():
    gpt2_old = item(config())  # a run config from before model.arch: GPT-2's
    gpt2_new = item(config(**{"model.arch": "gpt2", "model.bias": False}))
    assert gpt2_old.settings["model.arch"] == "gpt2"
    # the two families at one shape: the size facet says which, no LLaMA key becomes a column
    both = [gpt2_old, item(llama())]
    assert labels_of(both) == ["GPT-2 tiny", "LLaMA tiny"]
    assert labels_of([gpt2_new, item(llama())]) == ["GPT-2 tiny", "LLaMA tiny"]
    # a LLaMA key that varies among LLaMA runs is a column (the GPT-2 run has no value there)
    gqa = [item(llama(**{"model.n_kv_head": k})) for k in (1, 2, 4)]
    assert labels_of([gpt2_old, *gqa]) == ["GPT-2 tiny", "LLaMA tiny, n_kv_head=1", "LLaMA tiny, n_kv_head=2",
                                          "LLaMA tiny, n_kv_head=4"]  # fmt: skip
    narrow = {"model.n_layer": 2, "model.n_head": 2, "model.n_embd": 64, "model.block_size": 64}
    assert labels_of([item(config(**narrow)), item(llama(**narrow))]) == ["2L/64d", "LLaMA 2L/64d"]
    assert common_description(varying_columns(gqa), gqa) == "MARS-AdamW (approx), LLaMA tiny"


def test_runs_of_two_architectures_are_not_compared_unless_a_sweep_chose_them(tmp_path):
    from mars.analysis.groups import check_comparable
    from mars.errors import UserError

    write_run(tmp_path / "a" / "0", config(), [], power_law)
    write_run(tmp_path / "b" / "0", llama(), [], power_law)
    with pytest.raises(UserError, match=r"runs differ in model\.arch \(gpt2 in 1 run .*, llama in 1 run"):
        check_comparable(load_runs([tmp_path / "a", tmp_path / "b"]))
    write_run(tmp_path / "s" / "0", config(), ["model=gpt2_tiny"], power_law)
    write_run(tmp_path / "s" / "1", llama(), ["model=llama_tiny"], power_law)
    check_comparable(load_runs([tmp_path / "s"]))  # one multirun swept model=...
