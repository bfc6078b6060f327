"""The architectures a run can train: one ModelSpec per `model.arch` value, in one registry.

Everything outside an architecture's own module asks its spec (``arch(name)``, ``spec_of(model)``)
instead of knowing the model: the trainer builds through it, FSDP shards and compile wraps its
``blocks``, MFU uses its ``flops_per_token``, checkpoints, resume and reports compare its
``shape_keys``, the optimizers group parameters by its ``param_roles``, and Hugging Face export,
import and lm-eval go through its ``hf_adapter``. docs/llama.md ("Adding an architecture") lists
what a new one provides; in short: one module that defines the config dataclass (first field
``arch``; the other fields are the ``model.*`` keys), the nn.Module and a ``register_arch(...)``
call at its end, named in ARCH_MODULES below; presets in configs/model/*.yaml extending
``/schema/model/NAME@_here_``; optionally an HF adapter module.

This module imports no torch: the registry fills on first use by importing ARCH_MODULES.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The modules that define (and register) the built-in architectures, imported on first lookup.
ARCH_MODULES = ("mars.model.gpt", "mars.model.llama")
DEFAULT_ARCH = "gpt2"  # a model.json or run config without `arch` (written before there were two)
ROLES = ("embedding", "head", "hidden", "vector")


@dataclass(frozen=True)
class ModelSpec:
    """What the harness needs to know about one architecture.

    name           the ``model.arch`` value ("gpt2", "llama")
    title          how reports name the family ("GPT-2", "LLaMA")
    config         its config dataclass: first field ``arch``, the others the ``model.*`` keys
    model          its nn.Module class: ``Model(config)`` builds it initialised from the global RNG;
                   ``Model.empty(config, device, dtype=None, on_meta=None)`` allocates it unset (built on
                   the meta device, ``on_meta`` e.g. FSDP sharding applied there);
                   ``init_weights(generator)`` draws every tensor whole from the generator (the same
                   weights whether replicated or sharded); ``forward(idx, targets) -> (logits, loss)``;
                   ``num_params(non_embedding)``; ``tie_weights()`` (after ``to_empty``)
    blocks         model -> the nn.ModuleList of its repeated blocks (FSDP shards and compile wraps each)
    flops_per_token  (config, seq_len | None) -> training FLOPs per token (MFU)
    count_params   (config, non_embedding) -> model.num_params(non_embedding) without building it
    param_roles    model -> {parameter name: role}, role in ROLES: "embedding" (token/position tables,
                   a tied head), "head" (an untied output matrix), "hidden" (the other matrices: what
                   Muon / MARS-M orthogonalise), "vector" (norm gains, biases)
    tied           config -> {alias: stored name} of parameters stored once (a tied head)
    shape_keys     config keys that fix the parameter shapes: a checkpoint loads only into the same
                   values; fixed on resume; reports never average runs that differ in them
    fixed_keys     further keys fixed on resume (they change the function, not the shapes)
    required_keys  keys a saved model.json must hold (fields added later take their defaults, or
                   their legacy_values)
    legacy_values  {key: value} for fields added after files were written without them, where the
                   old behaviour is not the new default: a saved model.json or run config that lacks
                   the key reads as this value (GPT-2: activation "gelu", the exact GELU it had)
    validate       config -> None, or ValueError "model.KEY=VALUE ...; what to do" (one line)
    sizes          (n_layer, n_head, n_embd) -> a size name ("small") for labels: "GPT-2 small"
    hf_adapter     name of a module with HF_MODEL_TYPE, to_hf(model, attn_implementation="sdpa",
                   tokenizer=None), from_hf(hf_model), and optionally finish_export(out_dir, model)
                   (touches up the written directory)
    """

    name: str
    title: str
    config: type
    model: type
    blocks: Callable[[Any], Any]
    flops_per_token: Callable[[Any, int | None], float]
    count_params: Callable[[Any, bool], int]
    param_roles: Callable[[Any], dict[str, str]]
    tied: Callable[[Any], dict[str, str]]
    shape_keys: tuple[str, ...]
    fixed_keys: tuple[str, ...] = ()
    required_keys: tuple[str, ...] = ()
    legacy_values: Mapping[str, Any] = field(default_factory=dict)
    validate: Callable[[Any], None] = lambda config: None
    sizes: Mapping[tuple[int, int, int], str] = field(default_factory=dict)
    hf_adapter: str | None = None

    def hf(self):
        """The Hugging Face adapter module (imported now: it may import transformers)."""
        if self.hf_adapter is None:
            raise ValueError(f"model.arch={self.name} has no Hugging Face adapter")
        return importlib.import_module(self.hf_adapter)

    def size_name(self, n_layer: Any, n_head: Any, n_embd: Any) -> str:
        """ "GPT-2 small", "LLaMA 124m", or "4L/256d" ("LLaMA 2L/64d": the family is named unless GPT-2)."""
        size = self.sizes.get((n_layer, n_head, n_embd))
        if size:
            return f"{self.title} {size}"
        shape = f"{n_layer}L/{n_embd}d"
        return shape if self.name == DEFAULT_ARCH else f"{self.title} {shape}"


_REGISTRY: dict[str, ModelSpec] = {}
_loaded = False  # the built-ins and the plugins
_builtins_loaded = False


def register_arch(spec: ModelSpec) -> ModelSpec:
    """Add an architecture (call at the end of its module). Its config's first field must be `arch`
    with default ``spec.name``; a name is registered once: another module's spec under a registered
    name (a built-in's) is refused, whatever its classes are called (mars.plugins.refuse_takeover), and
    re-importing the same module changes nothing."""
    from mars.plugins import refuse_takeover

    fields = dataclasses.fields(spec.config)
    if not fields or fields[0].name != "arch" or fields[0].default != spec.name:
        raise ValueError(
            f"register_arch({spec.name!r}): the config's first field must be arch = {spec.name!r}"
        )
    if spec.model.__module__ not in ARCH_MODULES:
        _load_builtins()  # a plugin's name is checked against every built-in, loaded or not yet
    old = _REGISTRY.get(spec.name)
    if old is not None:
        refuse_takeover("architecture", spec.name, _parts(old), _parts(spec))
    _REGISTRY[spec.name] = spec
    return spec


def _parts(spec: ModelSpec) -> dict[str, Any]:
    """A spec's fields by name: what tells two registrations of an architecture apart."""
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True  # first: each module registers through register_arch while it loads
        for module in ARCH_MODULES:
            importlib.import_module(module)


def _load() -> None:
    """Import the built-in architectures, then the plugins (mars.plugins), which may register more."""
    global _loaded
    if not _loaded:
        _loaded = True
        _load_builtins()
        from mars.plugins import load_plugins

        load_plugins()


def arch_names() -> tuple[str, ...]:
    _load()
    return tuple(_REGISTRY)


def arch(name: Any) -> ModelSpec:
    """The spec of ``model.arch=name``; ValueError naming the registered ones."""
    _load()
    if name not in _REGISTRY:
        raise ValueError(
            f"model.arch={name!r} is not a known architecture; choose one of {', '.join(_REGISTRY)}"
        )
    return _REGISTRY[name]


def arch_of(config: Any) -> str:
    """The ``arch`` of a config dataclass, OmegaConf node or mapping (absent: gpt2, as before there were
    two)."""
    value = config.get("arch") if isinstance(config, Mapping) else getattr(config, "arch", None)
    if value is None and not isinstance(config, Mapping) and hasattr(config, "get"):
        value = config.get("arch")  # DictConfig
    return DEFAULT_ARCH if value is None else str(value)


def spec_for(config: Any) -> ModelSpec:
    return arch(arch_of(config))


def spec_of(model: Any) -> ModelSpec:
    """The spec of a built model (inside torch.compile / DDP wrappers too); TypeError for anything else."""
    inner = model
    while True:
        if hasattr(inner, "_orig_mod"):
            inner = inner._orig_mod
        elif type(inner).__name__ == "DistributedDataParallel":
            inner = inner.module
        else:
            break
    _load()
    for spec in _REGISTRY.values():
        if isinstance(inner, spec.model):
            return spec
    raise TypeError(
        f"expected a model of a registered architecture ({', '.join(_REGISTRY)}), got {type(inner).__name__}"
    )


def _type_ok(value: Any, annotation: Any) -> bool:
    """A JSON / YAML value against a config field's type (int | None, float, bool, str)."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    options = typing.get_args(annotation) if union else ()
    if options:
        return any(_type_ok(value, o) for o in options)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is float:  # inf and nan are floats: the values' rules (finite, > 0) are check_values'
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


def _type_name(annotation: Any) -> str:
    options = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    name = " or ".join(getattr(a, "__name__", str(a)) for a in options)
    return name + (" or null" if type(None) in typing.get_args(annotation) else "")


def model_config(values: Any, where: str = "model") -> Any:
    """The config dataclass of ``values`` (a config dataclass already, an OmegaConf node or a mapping):
    the spec named by its ``arch`` (absent: gpt2), missing keys at their defaults. ValueError, naming
    ``where``, for an unknown arch, a key that architecture does not take, or a value of the wrong type."""
    if dataclasses.is_dataclass(values) and not isinstance(values, type):
        spec = spec_for(values)
        if not isinstance(values, spec.config):
            raise ValueError(f"{where}: a {type(values).__name__} is not model.arch={spec.name}'s config")
        return values
    if type(values).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        values = OmegaConf.to_container(values, resolve=True)
    if not isinstance(values, Mapping):
        raise ValueError(f"{where}: expected a model config mapping, found {type(values).__name__}")
    spec = spec_for(values)
    fields = typing.get_type_hints(spec.config)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(
            f"{where}: model.arch={spec.name} has no key {', '.join(map(repr, unknown))}; its keys: "
            f"{', '.join(k for k in fields if k != 'arch')}"
        )
    for key, value in values.items():
        if not _type_ok(value, fields[key]):
            raise ValueError(f"{where}: {key}={value!r} should be a {_type_name(fields[key])}")
    return spec.config(**{**values, "arch": spec.name})


def validate_model(config: Any) -> None:
    """The architecture's own value checks; ValueError "model.KEY=VALUE ...; fix" (one line)."""
    check_values(model_config(config))


def check_values(config: Any) -> None:
    """A config dataclass's values: its architecture's rules (spec.validate, e.g. model.rope_theta "must be
    a finite number > 0"), then every float a finite number; ValueError "model.KEY=VALUE ..." (one line)."""
    spec_for(config).validate(config)
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"model.{f.name}={value!r} must be a finite number")


def roles_by_name(model: Any, embeddings: tuple[str, ...], heads: tuple[str, ...] = ()) -> dict[str, str]:
    """param_roles for a model whose embedding and head parameters are named: the rest are "hidden"
    (2-D and up) or "vector". A tied head shares the embedding's tensor and is listed under it."""
    roles = {}
    for name, p in model.named_parameters():
        if name in embeddings:
            roles[name] = "embedding"
        elif name in heads:
            roles[name] = "head"
        else:
            roles[name] = "hidden" if p.ndim >= 2 else "vector"
    return roles
