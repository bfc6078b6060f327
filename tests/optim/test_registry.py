"""The optimizer registry: every key of every optimizer's config reaches the optimizer it builds, and
configs refuse keys and values that cannot work."""

from __future__ import annotations

import dataclasses

import pytest
from optim_helpers import TinyGPT

from mars.optim import OPTIMIZER_NAMES, GammaScheduleConfig, build_optimizer, make_config, registered


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


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_every_key_of_every_optimizer_config_is_used(name):
    spec = registered(name)
    base = spec.config()
    assert base.name == name
    model = TinyGPT()
    reference = fingerprint(build_optimizer(model, base))
    keys = [f.name for f in dataclasses.fields(base) if f.name != "name"]
    for key in keys:
        changed = dataclasses.replace(base, **{key: other_value(key, getattr(base, key))})
        if key in spec.trainer_keys:  # driven by the trainer every step (mars.train.schedule)
            from mars.train.schedule import GammaSchedule

            before = GammaSchedule(base.gamma, base.gamma_schedule, 10)
            after = GammaSchedule(changed.gamma, changed.gamma_schedule, 10)
            assert [before(t) for t in range(10)] != [after(t) for t in range(10)], key
            continue
        assert fingerprint(build_optimizer(model, changed)) != reference, f"{name}: {key} changes nothing"


@pytest.mark.parametrize(
    "cfg, message",
    [
        ({"name": "mars_adamw", "betas": [1.2, 0.99]}, r"optimizer.betas=\[1.2, 0.99\] must be a pair"),
        ({"name": "mars_m", "gamma": -0.1}, r"optimizer.gamma=-0.1 must be a finite number >= 0"),
        ({"name": "muon", "momentum": 1.0}, r"optimizer.momentum=1.0 must be a number in \[0, 1\)"),
        ({"name": "moonlight", "ns_steps": 0}, r"optimizer.ns_steps=0 must be >= 1"),
        (
            {"name": "mars_lion", "two_dim_rule": "eq3"},
            r"optimizer.two_dim_rule='eq3' must be one of eq2, ge2",
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
            r"gamma_schedule.name='step' must be one of",
        ),
        (
            {"name": "mars_adamw", "gamma_schedule": {"end": -1.0}},
            r"gamma_schedule.end=-1.0 must be a number >= 0",
        ),
    ],
)
def test_invalid_values_are_one_line_naming_the_key(cfg, message):
    with pytest.raises(ValueError, match=message):
        make_config(cfg).validate()
