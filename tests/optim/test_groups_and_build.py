"""param_groups, build_optimizer, the optimizer configs, set_lr_factor, and a least-squares descent check."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from optim_helpers import TinyGPT, applicable, set_random_grads
from torch import nn

from mars.optim import (
    MARS,
    MARSM,
    Lion,
    LionConfig,
    Moonlight,
    Muon,
    build_optimizer,
    optimizer_names,
    param_groups,
    registered,
    set_lr_factor,
)

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "optimizer"


def names(model, params):
    by_id = {id(p): n for n, p in model.named_parameters()}
    return sorted(by_id[id(p)] for p in params)


def linear_weights(model):
    return sorted(
        n for n, p in model.named_parameters() if n.endswith("weight") and p.ndim == 2 and ".h." in n
    )


@pytest.mark.parametrize("name", ["adamw", "lion", "mars_adamw", "mars_lion", "mars_shampoo"])
def test_decay_groups_follow_the_reference(name):
    model = TinyGPT(bias=True)
    decay, no_decay = param_groups(model, name, weight_decay=0.01)
    assert names(model, decay["params"]) == linear_weights(model) and decay["weight_decay"] == 0.01
    assert no_decay["weight_decay"] == 0.0
    assert "transformer.wte.weight" in names(model, no_decay["params"])  # tied with lm_head: once, no decay
    assert "transformer.wpe.weight" in names(model, no_decay["params"])
    assert all(
        p.ndim < 2
        for p in no_decay["params"]
        if p is not model.transformer.wte.weight and p is not model.transformer.wpe.weight
    )
    n_unique = len({id(p) for p in model.parameters()})
    assert len(decay["params"]) + len(no_decay["params"]) == n_unique


@pytest.mark.parametrize("name", ["muon", "moonlight", "mars_m"])
def test_matrix_optimizers_send_embeddings_head_and_1d_to_adamw(name):
    model = TinyGPT(bias=True)
    model.lm_head = nn.Linear(96, 11, bias=False)  # untied head: still AdamW
    hidden, rest = param_groups(model, name)
    assert hidden["use_muon"] is True and rest["use_muon"] is False
    assert names(model, hidden["params"]) == linear_weights(model)
    rest_names = names(model, rest["params"])
    assert {"transformer.wte.weight", "transformer.wpe.weight", "lm_head.weight"} <= set(rest_names)
    assert all(
        p.ndim < 2
        for n, p in model.named_parameters()
        if n in rest_names and "wte" not in n and "wpe" not in n and "lm_head" not in n
    )


def test_untied_head_decays_in_mars_and_frozen_parameters_are_left_out():
    model = TinyGPT(n_layer=2)
    model.lm_head = nn.Linear(96, 11, bias=False)
    model.transformer.h[1].mlp.c_fc.weight.requires_grad_(False)
    decay, no_decay = param_groups(model, "mars_adamw")
    assert "lm_head.weight" in names(model, decay["params"])
    assert "transformer.h.1.mlp.c_fc.weight" not in names(model, decay["params"] + no_decay["params"])
    with pytest.raises(ValueError, match="unknown optimizer name 'sgd'"):
        param_groups(model, "sgd")


EXPECTED_CLASS = {
    "adamw": torch.optim.AdamW,
    "lion": Lion,
    "muon": Muon,
    "moonlight": Moonlight,
    "mars_adamw": MARS,
    "mars_lion": MARS,
    "mars_shampoo": MARS,
    "mars_m": MARSM,
}


@pytest.mark.parametrize("name", optimizer_names())
def test_configs_load_and_build_every_optimizer(name):
    path = CONFIG_DIR / f"{name}.yaml"
    plain = yaml.safe_load(path.read_text())
    assert plain.pop("defaults") == [f"/schema/optimizer/{name}@_here_", "_self_"]  # its own schema
    assert plain["name"] == name
    assert set(plain) <= set(registered(name).config.keys()), f"{path}: keys {name} does not take"
    merged = OmegaConf.merge(OmegaConf.structured(registered(name).config), plain)
    model = TinyGPT()
    opt = build_optimizer(model, OmegaConf.to_object(merged))
    assert type(opt) is EXPECTED_CLASS[name]
    assert opt.needs_previous_grads is False
    assert opt.param_groups[0]["lr"] == plain["lr"]
    set_random_grads(model, 0)
    opt.step()


def test_reference_hyperparameters_reach_the_optimizers():
    model = TinyGPT()

    def build(name, **kw):
        cfg = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())
        cfg.pop("defaults")
        return build_optimizer(model, {**cfg, **kw})

    mars = build("mars_adamw")
    decay, no_decay = mars.param_groups
    assert (decay["lr"], decay["weight_decay"], no_decay["weight_decay"]) == (6e-3, 0.01, 0.0)
    assert (decay["lr_1d"], decay["betas"], decay["betas_1d"], decay["gamma"]) == (
        3e-3,
        (0.95, 0.99),
        (0.9, 0.95),
        0.025,
    )
    assert mars.is_approx and not build("mars_adamw", approx=False).is_approx
    assert build("mars_adamw", approx=False).needs_previous_grads is True
    assert build("mars_shampoo").param_groups[0]["mars_type"] == "mars-shampoo"
    adamw = build("adamw")
    assert adamw.defaults["fused"] is True and adamw.param_groups[0]["weight_decay"] == 0.1
    muon = build("muon")
    hidden, rest = muon.param_groups
    assert (hidden["lr"], hidden["weight_decay"], hidden["nesterov"]) == (2e-2, 0.0, True)
    assert (rest["lr"], rest["weight_decay"], rest["adamw_betas"]) == (3e-3, 0.1, (0.9, 0.95))
    moon = build("moonlight")
    assert [(g["lr"], g["weight_decay"]) for g in moon.param_groups] == [(6e-3, 0.1)] * 2
    assert moon.param_groups[0]["nesterov"] is False
    mars_m = build("mars_m")
    assert [(g["lr"], g["weight_decay"]) for g in mars_m.param_groups] == [(6e-3, 0.01)] * 2
    assert mars_m.param_groups[0]["clip_c"] is True and mars_m.param_groups[0]["momentum"] == 0.95
    assert build("mars_m", lean=True).lean and build("mars_m", approx=False).needs_previous_grads


def test_build_optimizer_rejects_unknown_names_and_keys():
    with pytest.raises(ValueError, match="unknown optimizer name 'adam'"):
        build_optimizer(TinyGPT(), {"name": "adam"})
    with pytest.raises(ValueError, match="optimizer=adamw has no key 'learning_rate'; its keys: lr, betas,"):
        build_optimizer(TinyGPT(), {"name": "adamw", "learning_rate": 1e-3})
    with pytest.raises(ValueError, match="optimizer=adamw has no key 'lr_1d'"):
        build_optimizer(TinyGPT(), {"name": "adamw", "lr_1d": 1e-3})
    assert type(build_optimizer(TinyGPT(), LionConfig())) is Lion


@pytest.mark.parametrize("name", ["mars_adamw", "adamw", "muon"])
def test_set_lr_factor_scales_from_the_initial_values_and_survives_a_checkpoint(name):
    model = TinyGPT()
    opt = build_optimizer(model, applicable(name, lr=1e-2, lr_1d=4e-3))
    initial = [(g["lr"], g.get("lr_1d")) for g in opt.param_groups]
    set_lr_factor(opt, 0.5)
    set_lr_factor(opt, 0.25)  # not compounded
    for g, (lr, lr_1d) in zip(opt.param_groups, initial, strict=True):
        assert g["lr"] == pytest.approx(0.25 * lr)
        if lr_1d is not None:
            assert g["lr_1d"] == pytest.approx(0.25 * lr_1d)
    resumed = build_optimizer(TinyGPT(), applicable(name, lr=1e-2, lr_1d=4e-3))
    resumed.load_state_dict(opt.state_dict())
    set_lr_factor(resumed, 0.1)
    for g, (lr, lr_1d) in zip(resumed.param_groups, initial, strict=True):
        assert g["lr"] == pytest.approx(0.1 * lr)
        assert g.get("lr_1d") is None or g["lr_1d"] == pytest.approx(0.1 * lr_1d)


# learning rates for a 60-step toy problem (the GPT-2 ones are tuned for 100k steps)
DESCENT_LR = {
    "adamw": 3e-2,
    "lion": 1e-2,
    "muon": 5e-2,
    "moonlight": 5e-2,
    "mars_adamw": 3e-2,
    "mars_lion": 1e-2,
    "mars_shampoo": 5e-2,
    "mars_m": 5e-2,
}


DESCENT_CASES = [(n, False) for n in optimizer_names()] + [
    (n, True) for n in optimizer_names() if n.startswith("mars")
]


@pytest.mark.parametrize(
    "name,exact", DESCENT_CASES, ids=[f"{n}-{'exact' if e else 'approx'}" for n, e in DESCENT_CASES]
)
def test_every_optimizer_lowers_a_least_squares_loss(name, exact):
    gen = torch.Generator().manual_seed(0)
    target = nn.Linear(12, 6)
    model = nn.Sequential(nn.Linear(12, 16), nn.Linear(16, 6))
    batches = [torch.randn(32, 12, generator=gen) for _ in range(61)]

    def loss(x):
        with torch.no_grad():
            y = target(x)
        return ((model(x) - y) ** 2).mean()

    opt = build_optimizer(
        model,
        applicable(
            name,
            lr=DESCENT_LR[name],
            lr_1d=DESCENT_LR[name],
            approx=not exact,
            weight_decay=0.0,
            weight_decay_1d=0.0,
        ),
    )
    with torch.no_grad():
        start = sum(loss(x) for x in batches[:8]).item()
    for t in range(60):
        if opt.needs_previous_grads:
            loss(batches[t + 1]).backward()
            opt.stash_previous_grads()
            opt.zero_grad()
        loss(batches[t]).backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        end = sum(loss(x) for x in batches[:8]).item()
    assert end < 0.15 * start, (start, end)
