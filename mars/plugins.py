"""Code from outside the package: modules that register optimizers, architectures or data sources.

A plugin is an importable Python module that, when imported, adds to the public registries:
``mars.optim.registry.register`` (an optimizer: e.g. a MARS subclass with another correction c_t),
``mars.model.spec.register_arch`` (an architecture), ``mars.data.register_source`` (a data source).
It needs no file in this repository: a registered optimizer or architecture without a YAML file in
configs/ is selectable as ``optimizer=NAME`` / ``model=NAME`` with its config dataclass's defaults
(mars.train.config.register_configs). docs/hacking.md walks through writing one.

Two ways to name plugins, both read before any config is composed (a plugin must be imported before
Hydra can know that ``optimizer=my_variant`` exists):

    MARS_PLUGINS=my_optim,lab.metrics python train.py optimizer=my_variant
        comma-separated module names (importable: on sys.path or PYTHONPATH). An environment variable,
        so every rank under torchrun, every sweep job and ``python -m eval`` see the same plugins;

    [project.entry-points."mars.plugins"]  my_optim = "my_package.my_optim"
        an installed package's entry point in the group ``mars.plugins``: loaded wherever it is installed.

Each plugin is imported once per process. A plugin that cannot be imported stops the command with one
line naming it (ConfigError; exit status 2 at the command line).

A name is registered once: every registry refuses a second registration of a name with other objects
(``refuse_takeover``), so a plugin cannot silently replace a built-in optimizer, architecture, data
source or metric, nor another plugin's. Registering the same objects again, or a module's objects of
the same names again (the module imported a second time), changes nothing.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from typing import Any

from mars.errors import ConfigError

ENV = "MARS_PLUGINS"
ENTRY_POINT_GROUP = "mars.plugins"

_loaded: list[str] = []
_done = False


def _code(obj: Any) -> Any:
    """The class or function a registered object stands for (a functools.partial's function, an
    instance's class)."""
    obj = getattr(obj, "func", obj)
    return obj if hasattr(obj, "__qualname__") else type(obj)


def qualified_name(obj: Any) -> str:
    """``module.qualname`` of a registered class or function."""
    code = _code(obj)
    return f"{getattr(code, '__module__', '?')}.{code.__qualname__}"


def _same(a: Any, b: Any) -> bool:
    """One registration's part and another's: the same object, classes or functions of the same module
    and qualified name (their module imported again), or equal values."""
    if a is b:
        return True
    if callable(a) and callable(b):
        return qualified_name(a) == qualified_name(b)
    return not callable(a) and not callable(b) and a == b


def refuse_takeover(kind: str, name: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """ConfigError unless registering `new` under `name` changes nothing: `old` and `new` map the
    same parts ("config", "optimizer", ...) to the same things (``_same``). Otherwise one line naming
    what holds the name, what would replace it, and their modules."""
    differ = [part for part in old if not _same(old[part], new.get(part))]
    if not differ:
        return

    def side(parts: Mapping[str, Any]) -> tuple[str, str]:
        values = [parts.get(p) for p in differ]
        shown = [
            qualified_name(v) if callable(v) else f"{p}={v!r}" for p, v in zip(differ, values, strict=True)
        ]
        code = [_code(v) for v in (values if any(map(callable, values)) else parts.values()) if callable(v)]
        modules = dict.fromkeys(getattr(c, "__module__", "?") for c in code)
        return ", ".join(shown), ", ".join(modules) or "?"

    (old_names, old_modules), (new_names, new_modules) = side(old), side(new)
    raise ConfigError(
        f"{kind} {name!r} is already registered ({old_names}) by {old_modules}; {new_modules} registers "
        f"{new_names} under the same name, which would silently replace it: a plugin cannot take a "
        "built-in's (or another module's) name, so register it under a name of its own"
    )


def plugin_names() -> list[str]:
    """The module names of $MARS_PLUGINS, in order (empty entries ignored)."""
    return [name.strip() for name in os.environ.get(ENV, "").split(",") if name.strip()]


def _entry_points() -> list:
    from importlib.metadata import entry_points

    return list(entry_points(group=ENTRY_POINT_GROUP))


def load_plugins() -> list[str]:
    """Import every plugin (entry points of the group mars.plugins, then $MARS_PLUGINS), once per
    process; returns the module names imported so far. ConfigError naming the one that fails."""
    global _done
    if _done:
        return list(_loaded)
    _done = True  # set first: a plugin that imports mars modules calling load_plugins must not recurse
    sources = [
        (ep.value.split(":")[0], f"entry point {ep.name!r} of {ENTRY_POINT_GROUP}") for ep in _entry_points()
    ]
    sources += [(name, f"{ENV}={os.environ.get(ENV, '')}") for name in plugin_names()]
    for module, where in sources:
        if module in _loaded:
            continue
        try:
            importlib.import_module(module)
        except ConfigError as e:  # it imports, but registers what a registry refuses
            _done = False
            sys.modules.pop(module, None)
            raise ConfigError(f"{where}: plugin {module!r} cannot be loaded: {e}") from e
        except Exception as e:  # noqa: BLE001 - any failure of user code is reported as one line
            _done = False
            sys.modules.pop(module, None)
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
            raise ConfigError(
                f"{where}: cannot import plugin {module!r} ({reason}); put its directory on PYTHONPATH, "
                f"fix the module, or drop it from {ENV}"
            ) from e
        _loaded.append(module)
    return list(_loaded)
