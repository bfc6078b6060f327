"""The one place that knows the optimizers: name -> config dataclass + optimizer, and the one builder.

An optimizer's config dataclass lists the `optimizer.*` keys it takes (`name` first; a `validate()`
method checks the values), and every other field is a keyword of the optimizer's constructor, under
the same name. So one generic builder serves every optimizer: `build_optimizer` passes the config's
fields straight to the constructor, with the reference grouping of the model's parameters
(mars.optim.groups). The constructors also accept the MARS reference code's keyword names through
`REFERENCE_NAMES`, the one alias table.

Adding an optimizer means one module that defines the optimizer class (or a factory function), its
config dataclass and calls `register(...)` at its end (a builder function build(model, cfg,
process_group=None) is taken too, for an optimizer whose keywords differ from its config's fields);
then add configs/optimizer/NAME.yaml (the package imports each of its public modules). The training
config gets a Hydra schema per registered optimizer (mars.train.config), so a key the chosen
optimizer does not take fails when the config is composed. A variant defined outside the package
(e.g. a MARS subclass with another c_t) registers the same way, under a new name.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

GROUPINGS = ("decay", "matrix")

# The MARS reference code's keyword names -> this package's, which are the `optimizer.*` config keys.
REFERENCE_NAMES = MappingProxyType(
    {
        "wd": "weight_decay",
        "is_approx": "approx",
        "adamw_lr": "lr_1d",
        "adamw_betas": "betas_1d",
        "adamw_eps": "eps",
        "adamw_wd": "weight_decay_1d",
    }
)


def reference_names(init: Callable) -> Callable:
    """Decorate an optimizer's __init__ so that it also takes the reference's keyword names."""

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        given = {}  # this package's name -> the reference name the caller used
        for old, new in REFERENCE_NAMES.items():
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(
                        f"{type(self).__name__}() got both {new}= and its reference name {old}=; pass one"
                    )
                kwargs[new] = kwargs.pop(old)
                given[new] = old
        try:
            return init(self, *args, **kwargs)
        except ValueError as err:  # name the value as the caller did ("invalid is_approx='yes'")
            message = str(err)
            for new, old in given.items():
                message = message.replace(f"invalid {new}=", f"invalid {old}=")
            err.args = (message,)
            raise

    return wrapper


@dataclass(frozen=True)
class Registered:
    name: str
    config: type  # the config dataclass
    optimizer: Callable  # optimizer(params, **fixed, **config fields but name and trainer_keys)
    grouping: str  # "decay": weight decay on matrices | "matrix": hidden matrices vs the rest (Muon family)
    trainer_keys: tuple[str, ...] = ()  # keys the trainer drives (e.g. gamma_schedule), not the optimizer
    fixed: Mapping = field(default_factory=dict)  # constructor keywords this name fixes (MARS's mars_type)
    builder: bool = False  # `optimizer` is a build(model, cfg, process_group=None) function instead

    def keywords(self, config) -> dict:
        """The constructor keywords of a config instance (lists become tuples, as betas are)."""
        skip = {"name", *self.trainer_keys}
        values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in skip}
        return {**self.fixed, **{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}}

    def build(self, model, config, process_group=None):
        """The optimizer of a (validated) config instance over `model`, with the reference grouping."""
        if self.builder:
            return self.optimizer(model, config, process_group=process_group)
        from .groups import param_groups

        keywords = self.keywords(config)
        if "process_group" in inspect.signature(self.optimizer).parameters:
            keywords["process_group"] = process_group
        return self.optimizer(param_groups(model, self.name), **keywords)


_REGISTRY: dict[str, Registered] = {}


def register(
    name: str,
    config: type,
    optimizer: Callable,
    *,
    grouping: str,
    trainer_keys: tuple[str, ...] = (),
    fixed: Mapping | None = None,
) -> None:
    """Register `optimizer` under `name` with its config dataclass.

    optimizer: a class (or a function returning an optimizer) called as optimizer(param_groups,
    **fixed, **the config's fields but `name` and `trainer_keys`), so every such field must be one of
    its keywords. The older form, a builder build(model, cfg, process_group=None) (recognised by its
    first parameters, model and cfg), is still taken, for an optimizer whose keywords are not its
    config's fields."""
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
        from mars.plugins import RegistrationError, qualified_name

        raise RegistrationError(
            f"register({name!r}): {qualified_name(config)} has no validate() method; give it one that raises "
            "ValueError naming the bad optimizer.KEY (mars.optim.config.ConfigChecks has the shared checks), "
            "or `def validate(self): pass` to check nothing"
        )
    keywords = inspect.signature(optimizer).parameters
    builder = list(keywords)[:2] == ["model", "cfg"]
    missing = [k for k in [*field_names[1:], *(fixed or {})] if k not in keywords and k not in trainer_keys]
    if missing and not builder:
        raise ValueError(
            f"register({name!r}): {getattr(optimizer, '__name__', optimizer)} takes no keyword "
            f"{', '.join(missing)}: the fields of {config.__name__} must be its keywords (or trainer_keys)"
        )
    _REGISTRY[name] = Registered(
        name, config, optimizer, grouping, tuple(trainer_keys), MappingProxyType(dict(fixed or {})), builder
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
