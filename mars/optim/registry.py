"""The one place that knows the optimizers: name -> config dataclass + builder.

Adding an optimizer means adding one module that defines the optimizer class, its config dataclass
(its fields are the `optimizer.*` keys it takes, `name` first; a `validate()` method checks values)
and a `build(model, cfg, process_group=None)` function, and calls `register(...)` at its end; then
import the module in mars/optim/__init__.py and add configs/optimizer/NAME.yaml. The training
config gets a Hydra schema per registered optimizer (mars.train.config), so a key the chosen
optimizer does not take fails when the config is composed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

GROUPINGS = ("decay", "matrix")


@dataclass(frozen=True)
class Registered:
    name: str
    config: type  # the config dataclass
    build: Callable  # build(model, cfg, process_group=None) -> torch.optim.Optimizer
    grouping: str  # "decay": weight decay on matrices | "matrix": hidden matrices vs the rest (Muon family)
    trainer_keys: tuple[str, ...] = ()  # keys the trainer drives (e.g. gamma_schedule), not the builder


_REGISTRY: dict[str, Registered] = {}


def register(
    name: str, config: type, build: Callable, *, grouping: str, trainer_keys: tuple[str, ...] = ()
) -> None:
    if grouping not in GROUPINGS:
        raise ValueError(f"register({name!r}): grouping={grouping!r} must be one of {GROUPINGS}")
    if name in _REGISTRY and _REGISTRY[name].config is not config:
        raise ValueError(f"an optimizer named {name!r} is already registered")
    field_names = [f.name for f in dataclasses.fields(config)]
    if not field_names or field_names[0] != "name":
        raise ValueError(f"register({name!r}): the config's first field must be `name`")
    _REGISTRY[name] = Registered(name, config, build, grouping, trainer_keys)


def optimizer_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def registered(name: str) -> Registered:
    if name not in _REGISTRY:
        raise ValueError(f"unknown optimizer name {name!r}: expected one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def make_config(cfg):
    """The config dataclass instance of `cfg`: an instance already, or a mapping with "name" and any of
    that optimizer's keys (the rest take its defaults). A key the optimizer does not take is an error."""
    if not isinstance(cfg, Mapping):
        if dataclasses.is_dataclass(cfg) and getattr(cfg, "name", None) in _REGISTRY:
            return cfg
        raise TypeError(f"expected an optimizer config or a mapping, got {type(cfg).__name__}")
    name = cfg.get("name")
    if name is None:
        raise ValueError(f"the optimizer config needs a name (one of {', '.join(_REGISTRY)})")
    spec = registered(name)
    keys = {f.name: f for f in dataclasses.fields(spec.config)}
    unknown = sorted(set(cfg) - set(keys))
    if unknown:
        raise ValueError(
            f"optimizer={name} has no key {', '.join(map(repr, unknown))}; "
            f"its keys: {', '.join(k for k in keys if k != 'name')}"
        )
    values = {}
    for key, value in cfg.items():
        sub = keys[key].type
        if key == "gamma_schedule" and isinstance(value, Mapping):
            from .config import GammaScheduleConfig

            value = GammaScheduleConfig(**value)
        elif isinstance(value, tuple) or (isinstance(sub, str) and sub.startswith("list")):
            value = list(value)
        values[key] = value
    return spec.config(**values)


def build_optimizer(model, cfg, process_group=None):
    """Build the optimizer `cfg` names over `model` with the reference grouping (mars.optim.groups).

    cfg: a registered config dataclass instance, or a mapping of its keys with "name". process_group:
    the ranks a replicated model (DDP) is spread over; the optimizers that run Newton-Schulz divide it
    over them (sharded FSDP2 parameters need nothing: they carry their mesh)."""
    config = make_config(cfg)
    config.validate()
    return registered(config.name).build(model, config, process_group=process_group)
