"""The one place that knows the optimizers: name -> config dataclass + optimizer + grouping, the one
builder, and the parameter groups of a registered optimizer.

An optimizer's config dataclass lists the `optimizer.*` keys it takes (`name` first; its value checks
are mars.optim.config's), and every other field is a keyword of the optimizer's constructor, under
the same name. So one generic builder serves every optimizer: `build_optimizer` passes the config's
fields straight to the constructor, with the reference grouping of the model's parameters
(mars.optim.groups).

Adding an optimizer means one module that defines the optimizer class (or a function returning one)
and its config dataclass and calls `register(...)` at its end (the package imports each of its public
modules); configs/optimizer/NAME.yaml is optional (without one, optimizer=NAME takes the dataclass's
defaults). The training config gets a Hydra schema per registered optimizer (mars.train.config), so a
key the chosen optimizer does not take fails when the config is composed. A variant defined outside
the package (e.g. a MARS subclass with another c_t) registers the same way, under a new name.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .groups import GROUPINGS, grouped
from .mup import resolve as resolve_mup
from .mup import split as split_mup


@dataclass(frozen=True)
class Registered:
    name: str
    config: type  # the config dataclass
    optimizer: Callable  # optimizer(params, **fixed, **config fields but name and trainer_keys)
    grouping: str  # "decay": weight decay on matrices | "matrix": hidden matrices vs the rest (Muon family)
    trainer_keys: tuple[str, ...] = ()  # keys the trainer drives (e.g. gamma_schedule), not the optimizer
    fixed: Mapping = field(default_factory=dict)  # constructor keywords this name fixes (MARS's mars_type)
    mup: Callable | str | None = None  # its muP lr rule (mars.optim.mup); a str (why) or None: refused

    def keywords(self, config) -> dict:
        """The constructor keywords of a config instance (lists become tuples, as betas are)."""
        skip = {"name", *self.trainer_keys}
        values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in skip}
        return {**self.fixed, **{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}}

    def groups(self, model, weight_decay: float | None = None) -> list[dict]:
        """The reference grouping of `model` for this optimizer; a muP model's split by its muP multipliers
        (each group's lr_mult and wd_mult: mars.optim.mup)."""
        groups = grouped(model, self.grouping, weight_decay, name=self.name)
        return split_mup(model, groups, self.mup, self.name)

    def build(self, model, config, process_group=None):
        """The optimizer of a (validated) config instance over `model`, with the reference grouping (and a
        muP model's multipliers, applied to the config's lr and weight decay)."""
        keywords = self.keywords(config)
        if "process_group" in inspect.signature(self.optimizer).parameters:
            keywords["process_group"] = process_group
        groups = resolve_mup(self.groups(model), keywords.get("lr"), keywords.get("weight_decay"))
        return self.optimizer(groups, **keywords)


_REGISTRY: dict[str, Registered] = {}


def register(
    name: str,
    config: type,
    optimizer: Callable,
    *,
    grouping: str,
    trainer_keys: tuple[str, ...] = (),
    fixed: Mapping | None = None,
    mup: Callable | str | None = None,
) -> None:
    """Register `optimizer` under `name` with its config dataclass.

    optimizer: a class (or a function returning an optimizer) called as optimizer(param_groups,
    **fixed, **the config's fields but `name` and `trainer_keys`), so every such field must be one of
    its keywords. mup: its rule for muP models (mars.optim.mup: ELEMENTWISE for an Adam- or sign-type
    update, ...); without one (or with a str: why there is none), a muP model is refused with it."""
    if grouping not in GROUPINGS:
        raise ValueError(f"register({name!r}): grouping={grouping!r} must be one of {GROUPINGS}")
    if name in _REGISTRY:  # a plugin cannot replace a built-in: refused unless the same module's again
        from mars.plugins import refuse_takeover

        known = {"config": _REGISTRY[name].config, "optimizer": _REGISTRY[name].optimizer}
        refuse_takeover("optimizer", name, known, {"config": config, "optimizer": optimizer})
    field_names = [f.name for f in dataclasses.fields(config)]
    if not field_names or field_names[0] != "name":
        raise ValueError(f"register({name!r}): the config's first field must be `name`")
    if not callable(getattr(config, "validate", None)):
        from mars.errors import ConfigError
        from mars.plugins import qualified_name

        raise ConfigError(
            f"register({name!r}): {qualified_name(config)} has no validate() method; give it one that raises "
            "ValueError naming the bad optimizer.KEY (subclass mars.optim.config.OptimizerConfig and "
            "list its value_checks), or `def validate(self): pass` to check nothing"
        )
    keywords = inspect.signature(optimizer).parameters
    missing = [k for k in [*field_names[1:], *(fixed or {})] if k not in keywords and k not in trainer_keys]
    if missing:
        raise ValueError(
            f"register({name!r}): {getattr(optimizer, '__name__', optimizer)} takes no keyword "
            f"{', '.join(missing)}: the fields of {config.__name__} must be its keywords (or trainer_keys)"
        )
    _REGISTRY[name] = Registered(
        name, config, optimizer, grouping, tuple(trainer_keys), MappingProxyType(dict(fixed or {})), mup
    )


def optimizer_names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def registered(name: str) -> Registered:
    if name not in _REGISTRY:  # perhaps a plugin's (MARS_PLUGINS), not imported yet
        from mars.plugins import load_plugins

        load_plugins()
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
    values, types = {}, typing.get_type_hints(spec.config)  # resolvable: Hydra's schemas need them too
    for key, value in cfg.items():
        if dataclasses.is_dataclass(types[key]) and isinstance(value, Mapping):  # optimizer.gamma_schedule
            value = types[key](**value)
        elif isinstance(value, tuple) or typing.get_origin(types[key]) is list:
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


def param_groups(model, optimizer_name: str, weight_decay: float | None = None) -> list[dict]:
    """The reference's param groups of `model` for the registered optimizer `optimizer_name`
    (mars.optim.groups; trainable parameters only). weight_decay sets the decay group's value for the
    "decay" grouping (adamw, lion, the MARS types; otherwise the optimizer's default applies); the
    matrix optimizers take theirs from the constructor. A muP model's groups carry their multipliers
    (lr_mult, wd_mult): mars.optim.mup.resolve(groups, lr, weight_decay) applies them."""
    return registered(optimizer_name).groups(model, weight_decay)
