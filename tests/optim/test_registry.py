"""The optimizer registry: every key of every optimizer's config reaches the optimizer it builds (they are
its constructor's keywords; the reference's names stay aliases), the state-dict layout stays, and
configs refuse keys and values that cannot work."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from optim_helpers import TinyGPT, set_random_grads

from mars.optim import (
    MARS,
    MARSM,
    GammaScheduleConfig,
    Lion,
    LionConfig,
    Moonlight,
    Muon,
    build_optimizer,
    make_config,
    optimizer_names,
    registered,
    registry,
)


def other_value(key: str, value):
    """A valid value different from `value`, for any key of the optimizer configs."""
    if key == "gamma_schedule":
        return GammaScheduleConfig(name="linear", warmup_steps=2, start=0.01, end=0.001, decay_steps=9)
    if key == "two_dim_rule":
        return "ge2"
    if isinstance(value, bool):
        return not value
    if value is None:  # fused, MARS-M's clip_c
        return False
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 0.5 + 1e-3
    if isinstance(value, list):
        return [b * 0.9 for b in value]
    raise AssertionError(f"no other value for {key}={value!r}")


def fingerprint(opt) -> tuple:
    """What an optimizer was built with: its class, its param groups' settings, its plain attributes."""
    groups = [{k: v for k, v in g.items() if k not in ("params", "param_names")} for g in opt.param_groups]
    plain = (bool, int, float, str, tuple, type(None))
    attrs = {k: v for k, v in vars(opt).items() if isinstance(v, plain) and not k.startswith("_optimizer")}
    return type(opt).__name__, repr(groups), repr(sorted(attrs.items()))


@pytest.mark.parametrize("name", optimizer_names())
def test_every_key_of_every_optimizer_config_is_used(name):
    spec = registered(name)
    base = spec.config()
    assert base.name == name
    model = TinyGPT()
    reference = fingerprint(build_optimizer(model, base))
    keys = [f.name for f in dataclasses.fields(base) if f.name != "name"]
    for key in keys:
        changed = dataclasses.replace(base, **{key: other_value(key, getattr(base, key))})
        if key in spec.trainer_keys:  # driven by the trainer every step (the gamma schedule)
            before = [base.gamma_schedule.gamma(t, base.gamma, 10) for t in range(10)]
            after = [changed.gamma_schedule.gamma(t, changed.gamma, 10) for t in range(10)]
            assert before != after, key
            continue
        assert fingerprint(build_optimizer(model, changed)) != reference, f"{name}: {key} changes nothing"


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"name": "mars_adamw", "betas": [1.2, 0.99]}, r"optimizer.betas=\[1.2, 0.99\] must be a pair"),
        ({"name": "mars_m", "gamma": -0.1}, r"optimizer.gamma=-0.1 must be a finite number >= 0"),
        ({"name": "muon", "momentum": 1.0}, r"optimizer.momentum=1.0 must lie in \[0, 1\)"),
        ({"name": "moonlight", "ns_steps": 0}, r"optimizer.ns_steps=0 must be >= 1"),
        (
            {"name": "mars_lion", "two_dim_rule": "eq3"},
            r"optimizer.two_dim_rule='eq3' is not one of eq2, ge2",
        ),
        ({"name": "mars_m", "lean": True, "clip_c": True}, r"optimizer.clip_c=True cannot be true with lean"),
        (
            {"name": "mars_m", "lean": True, "diagnostics": True},
            r"optimizer.diagnostics=True needs lean=false",
        ),
        (
            {
                "name": "mars_adamw",
                "gamma_schedule": {"name": "cosine", "warmup_steps": 10, "decay_steps": 5},
            },
            r"gamma_schedule ends before it starts: decay_steps=5 is not after warmup_steps=10",
        ),
        (
            {"name": "mars_adamw", "gamma_schedule": {"name": "step"}},
            r"gamma_schedule.name='step' is not one of",
        ),
        (
            {"name": "mars_adamw", "gamma_schedule": {"end": -1.0}},
            r"gamma_schedule.end=-1.0 must be a finite number >= 0",
        ),
    ],
)
def test_invalid_values_are_one_line_naming_the_key(cfg, message):
    with pytest.raises(ValueError, match=message):
        make_config(cfg).validate()


def test_config_fields_are_the_constructor_keywords_and_the_reference_names_stay_aliases():
    def groups(opt):
        return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]

    w, b = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))
    split = [{"params": [w], "use_muon": True}, {"params": [b], "use_muon": False}]
    ours = MARSM(split, weight_decay=0.3, betas_1d=(0.8, 0.9), eps=1e-6, approx=False)
    theirs = MARSM(split, wd=0.3, adamw_betas=(0.8, 0.9), adamw_eps=1e-6, is_approx=False)
    assert groups(ours) == groups(theirs) and ours.is_approx is theirs.is_approx is False
    assert groups(Muon(split, lr_1d=1e-3, weight_decay_1d=0.2)) == groups(
        Muon(split, adamw_lr=1e-3, adamw_wd=0.2)
    )
    assert groups(Moonlight(split, weight_decay=0.2)) == groups(Moonlight(split, wd=0.2))
    assert MARS([w], is_approx=False).is_approx is False and MARS([w], approx=False).is_approx is False
    with pytest.raises(TypeError, match=r"got both weight_decay= and its reference name wd="):
        MARSM(split, wd=0.1, weight_decay=0.2)
    with pytest.raises(ValueError, match=r"invalid adamw_lr=-1.0"):  # named as the caller named it
        Muon(split, adamw_lr=-1.0)


def test_register_refuses_a_config_key_the_optimizer_does_not_take(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    @dataclasses.dataclass
    class LionTypo(LionConfig):
        name: str = "lion_typo"
        beta: float = 0.9

    with pytest.raises(ValueError, match=r"Lion takes no keyword beta: the fields of LionTypo must be"):
        registry.register("lion_typo", LionTypo, Lion, grouping="decay")


# What the state dicts of the optimizers hold (written by every version since the record was added):
# checkpoints of earlier runs must keep loading, so these names may not change.
LAYOUT = {
    "adamw": (
        {"amsgrad", "betas", "capturable", "decoupled_weight_decay", "differentiable", "eps", "foreach"}
        | {"fused", "lr", "maximize", "weight_decay"},
        {"exp_avg", "exp_avg_sq", "step"},
        None,
    ),
    "lion": ({"betas", "lr", "weight_decay"}, {"exp_avg"}, {"class": "Lion"}),
    "mars_adamw": (
        {"amsgrad", "betas", "betas_1d", "clip_c", "eps", "gamma", "lr", "lr_1d", "mars_type", "optimize_1d"}
        | {"two_dim_rule", "weight_decay", "weight_decay_1d"},
        {"exp_avg", "exp_avg_sq", "last_grad", "step"},
        {"class": "MARS", "is_approx": True},
    ),
    "muon": (
        {"adamw_betas", "adamw_eps", "lr", "momentum", "nesterov", "ns_steps", "use_muon", "weight_decay"},
        {"exp_avg", "exp_avg_sq", "momentum_buffer", "step"},
        {"class": "Muon"},
    ),
    "moonlight": (
        {"adamw_betas", "adamw_eps", "lr", "momentum", "nesterov", "ns_steps", "use_muon", "weight_decay"},
        {"exp_avg", "exp_avg_sq", "momentum_buffer", "step"},
        {"class": "Moonlight"},
    ),
    "mars_m": (
        {
            "adamw_betas",
            "adamw_eps",
            "clip_c",
            "gamma",
            "lr",
            "momentum",
            "ns_steps",
            "use_muon",
            "weight_decay",
        },
        {"exp_avg", "exp_avg_sq", "last_grad", "momentum_buffer", "step"},
        {"class": "MARSM", "is_approx": True, "lean": False},
    ),
}
LAYOUT["mars_lion"] = LAYOUT["mars_shampoo"] = LAYOUT["mars_adamw"]


@pytest.mark.parametrize("name", optimizer_names())
def test_the_state_dict_layout_is_the_one_checkpoints_were_written_with(name):
    model = TinyGPT(bias=True)
    opt = build_optimizer(model, {"name": name, **({} if name == "adamw" else {"fused": False})})
    set_random_grads(model, 0)
    opt.step()
    saved = opt.state_dict()
    group_keys, state_keys, record = LAYOUT[name]
    assert all(set(g) - {"params"} == group_keys for g in saved["param_groups"])
    assert set().union(*saved["state"].values()) == state_keys
    assert saved.get("mars_optim") == record
