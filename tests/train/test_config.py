"""Config composition, the structured schema, validation, and the paper presets against docs/algorithms.md."""

import itertools
import math
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from train_helpers import compose

from mars.errors import ConfigError
from mars.train.cli import config_dir, one_line, precheck
from mars.train.config import Config, register_configs, validate

CONFIGS = Path(config_dir())


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def test_default_config_is_the_tiny_cpu_run():
    cfg = compose()
    assert cfg.model.n_layer == 4 and cfg.model.n_embd == 256  # gpt2_tiny
    assert cfg.data.name == "embedded"
    assert cfg.optimizer.name == "mars_adamw" and cfg.optimizer.approx is True
    assert cfg.schedule.name == "cosine"
    assert cfg.train.grad_reduction == "mean"
    assert isinstance(OmegaConf.to_object(cfg), Config)
    validate(cfg)


def test_groups_have_the_documented_options():
    assert set(options("model")) >= {"gpt2_tiny", "gpt2_small", "gpt2_medium", "gpt2_large", "gpt2_xl"}
    assert set(options("data")) >= {"embedded", "openwebtext", "fineweb_edu", "local"}
    assert set(options("optimizer")) >= {
        "adamw",
        "lion",
        "muon",
        "moonlight",
        "mars_adamw",
        "mars_lion",
        "mars_shampoo",
        "mars_m",
    }
    assert set(options("schedule")) == {"cosine", "linear", "wsd", "constant"}


def test_every_group_combination_composes():
    """Each option of each group composes through Hydra; then every model x data x optimizer x schedule
    combination of those nodes (logger options cycled through) merges into the structured schema, which
    type-checks every value, and validates. Hydra's composition of these independent groups is exactly
    that merge, done here without its ~80 ms overhead per config: data and schedule are merged once per
    pair, into which each optimizer and model then goes in place of the last."""
    base = compose()
    nodes = {
        g: {o: compose([f"{g}={o}"])[g] for o in options(g)}
        for g in ("model", "data", "optimizer", "schedule", "logger")
    }
    assert nodes["optimizer"]["adamw"].name == "adamw" and nodes["schedule"]["wsd"].name == "wsd"
    loggers = itertools.cycle(nodes["logger"].values())
    merged = [
        OmegaConf.merge(base, {"data": data, "schedule": schedule}, {"logger": next(loggers)})
        for data, schedule in itertools.product(nodes["data"].values(), nodes["schedule"].values())
    ]
    count = 0
    for cfg, optimizer, model in itertools.product(
        merged, nodes["optimizer"].values(), nodes["model"].values()
    ):
        # optimizer and model have a schema per choice: Hydra replaces those nodes, it does not merge
        cfg.optimizer, cfg.model = optimizer, model
        validate(cfg)
        count += 1
    assert (
        count == math.prod(len(nodes[g]) for g in ("model", "data", "optimizer", "schedule")) >= 5 * 4 * 8 * 4
    )
    assert isinstance(OmegaConf.to_object(cfg), Config)
    assert (cfg.optimizer.name, cfg.model.n_embd) == (optimizer.name, model.n_embd)  # the last replacements


def test_every_experiment_composes_and_validates():
    names = sorted(
        str(p.relative_to(CONFIGS / "experiment").with_suffix(""))
        for p in (CONFIGS / "experiment").rglob("*.yaml")
    )
    assert len(names) > 10
    for name in names:
        cfg = compose([f"experiment={name}"])
        validate(cfg, world_size=1)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model=gpt2_foo"], "Could not find 'model/gpt2_foo'; Available options in 'model': gpt2_large,"),
        (["train.batch_size=abc"], "Value 'abc' of type 'str' could not be converted to Integer"),
        (["train.batchsize=3"], "Key 'batchsize' not in 'TrainConfig'"),
        (["optimizer.lrr=3"], "optimizer.lrr: optimizer=mars_adamw has no key 'lrr'; its keys: lr, betas,"),
        (["train.batch_size=0"], "train.batch_size=0 must be >= 1"),
        (
            ["train.global_batch_size=10", "train.batch_size=4"],
            "train.global_batch_size=10 is not a multiple",
        ),
        (["schedule.name=cos"], "schedule.name='cos' is not one of cosine, linear, wsd, constant"),
        (["train.dist_timeout_min=0"], "train.dist_timeout_min=0.0 must be > 0 (minutes)"),
        (["train.dist_timeout_min=inf"], "train.dist_timeout_min=inf must be a finite number > 0 (minutes)"),
        (
            ["train.dist_timeout_min=1e12"],
            "train.dist_timeout_min=1000000000000.0 must be <= 525600 (minutes, at most a year)",
        ),
        (
            ["-m", "optimizer.lr=1e-3,2e-3", "train.batch_size=4,0"],
            "(sweep job optimizer.lr=0.001 train.batch_size=0)",
        ),
        (["schedule.decay_steps=10", "schedule.warmup_steps=10"], "schedule.decay_steps=10 must be larger"),
    ],
)
def test_precheck_turns_bad_input_into_one_line(overrides, message):
    register_configs()  # what main() does first (the schemas of the optimizer and model groups)
    with pytest.raises(ConfigError) as e:
        precheck(overrides)
    text = str(e.value)
    assert message in text
    assert "\n" not in text and "Traceback" not in text


def test_a_foreign_key_in_a_config_file_names_that_file(tmp_path, monkeypatch):
    """The key, optimizer and keys come from OmegaConf's error attributes; the file from Hydra's message."""
    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs)
    (configs / "optimizer" / "my_adamw.yaml").write_text(
        "defaults:\n  - /schema/optimizer/adamw@_here_\n  - _self_\nname: adamw\ngamma: 0.1\n"
    )
    monkeypatch.setattr("mars.train.cli.config_dir", lambda: str(configs))
    register_configs()
    with pytest.raises(ConfigError) as e:
        precheck(["optimizer=my_adamw"])
    assert str(e.value) == (
        "optimizer.gamma (set in optimizer/my_adamw): optimizer=adamw has no key 'gamma'; "
        "its keys: lr, betas, eps, weight_decay, fused"
    )


def test_precheck_passes_good_sweeps_and_hydra_flags():
    plan = precheck(["-m", "optimizer.gamma=0,0.025", "optimizer.lr=3e-3,6e-3"])
    assert plan.multirun and plan.out_dir.is_absolute() and plan.out_dir.parts[-3] == "multirun"
    assert precheck(["--cfg", "job", "whatever.this=is"]) is None  # Hydra's own modes are left to Hydra


def test_gpus_per_job_needs_a_sweep_and_enough_gpus():
    import torch

    with pytest.raises(ConfigError, match="ignored by a single run"):
        precheck(["launch.gpus_per_job=2"])
    if torch.cuda.device_count() < 2:
        with pytest.raises(ConfigError, match=r"launch.gpus_per_job=2 but this machine shows \d GPU"):
            precheck(["-m", "launch.gpus_per_job=2", "train.seed=1,2"])


def test_validate_checks_divisibility_against_the_world_size():
    cfg = compose(["train.batch_size=4", "train.global_batch_size=8"])
    validate(cfg, world_size=2)
    with pytest.raises(ConfigError, match="4 x 4 = 16"):
        validate(cfg, world_size=4)


def test_validate_checks_a_config_once_and_a_changed_one_again(monkeypatch):
    """The run's own validate after the command's precheck is free, and never lets a changed config by."""
    import mars.train.config as config

    cfg = compose(["optimizer.gamma=0.0125"])
    validate(cfg)
    calls = []
    monkeypatch.setattr(config, "_validate", lambda *a: calls.append(a))
    validate(cfg)
    validate(compose(["optimizer.gamma=0.0125"]))  # composed again: the same config
    assert calls == []
    monkeypatch.undo()
    cfg.optimizer.gamma = -1.0
    with pytest.raises(ConfigError, match="optimizer.gamma=-1.0 must be a finite number >= 0"):
        validate(cfg)
    with pytest.raises(ConfigError, match="optimizer.gamma=-1.0"):
        validate(cfg)  # a config that failed is checked (and refused) every time


def test_validate_rejects_min_lr_above_lr_and_bad_choices():
    with pytest.raises(ConfigError, match="schedule.min_lr"):
        validate(compose(["schedule.min_lr=1.0"]))
    with pytest.raises(ConfigError, match="train.grad_reduction='avg'"):
        validate(compose(["train.grad_reduction=avg"]))
    with pytest.raises(ConfigError, match="downstream.tasks"):
        validate(compose(["downstream.interval=10"]))


def test_one_line_collapses_multiline_errors():
    class Fake(Exception):
        pass

    err = Fake(
        "In 'config': Could not find 'x/y'\n\nAvailable options in 'x':\n\ta\n\tb\nConfig search path:\n"
        "\tprovider=hydra, path=pkg://hydra.conf"
    )
    assert one_line(err) == "In 'config': Could not find 'x/y'; Available options in 'x': a, b"


# ----------------------------------------------------------------------------- paper presets

# docs/algorithms.md section 6, hard-coded: model shapes and the reference hyper-parameters (from the
# reference's run configs, config/train_gpt2_*.py).
SHAPES = {"small": (12, 12, 768), "medium": (24, 16, 1024), "large": (36, 20, 1280), "xl": (48, 25, 1600)}
LR = {  # size: AdamW lr, Muon lr, MARS lr, MARS lr_1d
    "small": (6e-4, 2e-2, 6e-3, 3e-3),
    "medium": (3e-4, 1e-2, 3e-3, 1.5e-3),
    "large": (2e-4, 6.67e-3, 2e-3, 1e-3),
    "xl": (2e-4, None, 2e-3, 1e-3),
}
MUON_ADAMW_LR = {"small": 3e-3, "medium": 1.5e-3, "large": 1e-3}  # reference configs (not in the table)
MIN_LR = {"small": 3e-5, "medium": 6e-5, "large": 1e-5, "xl": 1e-5}  # the configs' min_lr
EXPECTED_PRESETS = {
    *(f"owt_{s}_{k}" for s in ("small", "medium", "large") for k in ("adamw", "muon", "mars")),
    "owt_small_mars_exact",
    "owt_small_mars_m",
    "owt_small_moonlight",
    *(f"fineweb_{s}_{k}" for s in ("small", "xl") for k in ("adamw", "mars")),
}


def test_every_paper_preset_exists():
    assert set(options("experiment/paper")) - {"common"} == EXPECTED_PRESETS


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_paper_preset_matches_the_spec_table(name):
    data, size, kind = name.split("_", 2)
    cfg = compose([f"experiment=paper/{name}"])
    m, o, s, t = cfg.model, cfg.optimizer, cfg.schedule, cfg.train
    assert (m.n_layer, m.n_head, m.n_embd) == SHAPES[size]
    assert (m.block_size, m.vocab_size, m.bias, m.dropout, m.scale_attn_by_inverse_layer_idx) == (
        1024,
        50304,
        False,
        0.0,
        True,
    )
    assert cfg.data.name == {"owt": "openwebtext", "fineweb": "fineweb_edu"}[data]
    adamw_lr, muon_lr, mars_lr, mars_lr_1d = LR[size]
    if kind == "adamw":
        assert (o.name, o.lr, o.weight_decay, list(o.betas)) == ("adamw", adamw_lr, 0.1, [0.9, 0.95])
    elif kind == "muon":
        assert (o.name, o.lr, o.weight_decay, o.momentum) == ("muon", muon_lr, 0.0, 0.95)
        # its AdamW side (embeddings, head, 1-D) as in the reference configs
        assert (o.lr_1d, list(o.betas_1d), o.weight_decay_1d) == (MUON_ADAMW_LR[size], [0.9, 0.95], 0.1)
    elif kind in ("mars", "mars_exact"):
        assert (o.name, o.lr, o.lr_1d, o.weight_decay) == ("mars_adamw", mars_lr, mars_lr_1d, 0.01)
        assert (list(o.betas), o.gamma, o.approx) == ([0.95, 0.99], 0.025, kind == "mars")
        assert (o.optimize_1d, list(o.betas_1d), o.weight_decay_1d) == (False, [0.9, 0.95], 0.1)
    elif kind == "mars_m":
        assert (o.name, o.lr, o.momentum, o.weight_decay, o.gamma) == ("mars_m", 6e-3, 0.95, 0.01, 0.025)
        assert list(o.betas_1d) == [0.9, 0.95]
    elif kind == "moonlight":
        assert (o.name, o.lr, o.momentum, o.weight_decay) == ("moonlight", 6e-3, 0.95, 0.1)
        assert list(o.betas_1d) == [0.9, 0.95]
    else:
        raise AssertionError(f"unknown preset kind {kind}")
    # the reference loop runs iterations 0..max_iters inclusive, max_iters = lr_decay_iters = 100000
    assert (s.name, s.warmup_steps, s.decay_steps, s.min_lr) == ("cosine", 2000, 100000, MIN_LR[size])
    assert (t.max_steps, t.global_batch_size, t.grad_clip, t.grad_reduction) == (100001, 480, 1.0, "sum")
    assert m.activation == "gelu_tanh"
    for world_size in (1, 2, 4, 8):  # the micro-batch fits every usual GPU count
        validate(cfg, world_size=world_size)
