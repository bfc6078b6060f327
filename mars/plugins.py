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
line naming it (PluginError; exit status 2 at the command line).
"""

from __future__ import annotations

import importlib
import os
import sys

ENV = "MARS_PLUGINS"
ENTRY_POINT_GROUP = "mars.plugins"

_loaded: list[str] = []
_done = False


class PluginError(ValueError):
    """A plugin named in MARS_PLUGINS (or an entry point) could not be imported; the message says which."""


def plugin_names() -> list[str]:
    """The module names of $MARS_PLUGINS, in order (empty entries ignored)."""
    return [name.strip() for name in os.environ.get(ENV, "").split(",") if name.strip()]


def _entry_points() -> list:
    from importlib.metadata import entry_points

    return list(entry_points(group=ENTRY_POINT_GROUP))


def load_plugins() -> list[str]:
    """Import every plugin (entry points of the group mars.plugins, then $MARS_PLUGINS), once per
    process; returns the module names imported so far. PluginError naming the one that fails."""
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
        except Exception as e:  # noqa: BLE001 - any failure of user code is reported as one line
            _done = False
            sys.modules.pop(module, None)
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
            raise PluginError(
                f"{where}: cannot import plugin {module!r} ({reason}); put its directory on PYTHONPATH, "
                f"fix the module, or drop it from {ENV}"
            ) from e
        _loaded.append(module)
    return list(_loaded)
