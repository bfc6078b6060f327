"""Data sources by name: ``data.name`` -> the Source class that builds, checks and records that source.

    register_source("my_corpus", MyCorpus)      # or @register_source("my_corpus") on the class
    source_names()                               # ('embedded', 'openwebtext', 'fineweb_edu', 'local', ...)
    source_class(name, hf_path)                  # the class data.name=name selects
    get_source(cfg)                              # source_class(cfg.name, cfg.hf_path).from_config(cfg)
    check_values(cfg)                            # the data.* values that cannot work, before any work

The built-in sources (mars.data.sources: embedded, openwebtext, fineweb_edu; mars.data.local: local)
are registered here, by ``_load_builtins``, the first time a name is looked up or registered. A
``data.name`` that is not registered but comes with ``data.hf_path`` is a Hugging Face dataset of that
name (mars.data.sources.HFSource), prepared into ``data/NAME``: a new Hugging Face dataset is one
configs/data/NAME.yaml and no code. This module imports nothing heavy, so a plugin that only
registers a source costs nothing to import.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mars.data.config import FORMATS, SAMPLE_BY, VERIFY_LEVELS, DataConfig
from mars.errors import DataError

if TYPE_CHECKING:
    from mars.data.sources import Source

# A source's name is also its dataset directory's (data/NAME) and a Hydra config name.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

_registry: dict[str, type[Source]] = {}
_builtins_loaded = False


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True  # first: register_source below loads the built-ins too
        from mars.data.local import LocalSource
        from mars.data.sources import EmbeddedSource, FineWebEdu, OpenWebText
        from mars.plugins import load_plugins

        for name, cls in (
            ("embedded", EmbeddedSource),
            ("openwebtext", OpenWebText),
            ("fineweb_edu", FineWebEdu),
            ("local", LocalSource),
        ):
            register_source(name, cls)

        load_plugins()  # sources registered by MARS_PLUGINS modules or installed mars.plugins entry points


def register_source(name: str, source: Any = None) -> Any:
    """Make ``data.name=NAME`` select ``source``: a Source subclass, or a function DataConfig -> Source.

    Used as a decorator when ``source`` is omitted (``@register_source("my_corpus")``). A class decides
    how it is built and checked from the data config (``from_config``), what the manifest records about
    the request (``requested``) and the defaults null stands for (``config_defaults``); a function is
    wrapped in a Source subclass with the base class's choices. Registering a name twice with another
    source (a built-in's name, or another module's) is refused in one line naming both
    (mars.plugins.ConfigError); registering the same one again does nothing.
    """
    if source is None:
        return lambda cls: register_source(name, cls)
    from mars.data.sources import Source

    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ValueError(
            f"register_source: {name!r} cannot name a data source: it becomes data/NAME and configs/data/"
            "NAME.yaml, so use letters, digits, '.', '_' and '-', starting with a letter or digit"
        )
    if isinstance(source, type) and issubclass(source, Source):
        cls = source
    elif callable(source) and not isinstance(source, type):
        cls = _from_factory(name, source)
    else:
        raise TypeError(
            f"register_source({name!r}, ...): expected a mars.data.Source subclass or a function "
            f"DataConfig -> Source, got {source!r}"
        )
    _load_builtins()
    known = _registry.get(name)
    if known is not None:  # refused unless the same source again (its module imported a second time)
        from mars.plugins import refuse_takeover

        refuse_takeover(
            "data source", name, {"source": getattr(known, "_factory", known)}, {"source": source}
        )
    if known is None or getattr(known, "_factory", known) is not source:
        _registry[name] = cls
    return source


def _from_factory(name: str, factory: Callable[[DataConfig], Source]) -> type[Source]:
    from mars.data.sources import Source

    def from_config(cls, cfg: DataConfig) -> Source:
        return factory(cfg)

    return type(
        f"FactorySource_{name}",
        (Source,),
        {"from_config": classmethod(from_config), "_factory": factory, "__module__": factory.__module__},
    )


def source_names() -> tuple[str, ...]:
    """The registered source names: the built-ins first, then others in registration order."""
    _load_builtins()
    return tuple(_registry)


def unknown_source(name: Any) -> DataError:
    """The one line for a ``data.name`` that selects no source."""
    return DataError(
        f"data.name={name!r} is not a known source; choose one of {', '.join(source_names())} "
        "(configs/data/NAME.yaml), give data.hf_path for a Hugging Face dataset of that name, or "
        "register your own with mars.data.register_source"
    )


def find_source(name: Any, hf_path: str | None = None) -> type[Source] | None:
    """The class ``data.name=name`` selects, or None; with ``hf_path`` an unregistered name is HFSource."""
    _load_builtins()
    if not isinstance(name, str):
        return None
    if name in _registry:
        return _registry[name]
    if hf_path and NAME_RE.match(name):
        from mars.data.sources import HFSource

        return HFSource
    return None


def source_class(name: Any, hf_path: str | None = None) -> type[Source]:
    """``find_source``, raising a one-line DataError naming the known sources when there is none."""
    cls = find_source(name, hf_path)
    if cls is not None:
        return cls
    if hf_path and isinstance(name, str):
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-") or "my_dataset"
        raise DataError(
            f"data.name={name!r} names the dataset's directory (data/NAME): use letters, digits, '.', '_' "
            f"and '-', e.g. data.name={slug}"
        )
    raise unknown_source(name)


def get_source(cfg: DataConfig) -> Source:
    """The document source ``cfg.name`` selects, built and checked before any work is done."""
    return source_class(cfg.name, cfg.hf_path).from_config(cfg)


def store_config_options(configs_dir: Any) -> None:
    """Make ``data=NAME`` selectable for each registered source with no configs/data/NAME.yaml (one a
    plugin registered): stored in Hydra's ConfigStore as the data defaults with ``name: NAME``."""
    from pathlib import Path

    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name in source_names():
        if not (Path(configs_dir) / "data" / f"{name}.yaml").is_file():
            store.store(group="data", name=name, node=DataConfig(name=name))


def check_values(cfg: Any) -> None:
    """The data.* values that cannot work, each a ConfigError naming the key (cheap: reads no files;
    what needs the files, e.g. data.paths, is checked when the source is opened)."""
    from mars.checks import at_least, choice, get, reported_as
    from mars.errors import ConfigError

    try:  # a registered source, or any name with data.hf_path (a Hugging Face dataset)
        source_class(get(cfg, "name"), get(cfg, "hf_path"))
    except DataError as e:
        raise ConfigError(str(e)) from None
    with reported_as(ConfigError):
        for key, allowed in (("verify", VERIFY_LEVELS), ("text_sample_by", SAMPLE_BY)):
            choice(f"data.{key}", get(cfg, key), allowed)
        if get(cfg, "format") is not None:
            choice("data.format", get(cfg, "format"), FORMATS, " (or null)")
        for key, minimum in (("val_tokens", 0), ("shard_tokens", 1), ("num_workers", 1)):
            at_least(f"data.{key}", get(cfg, key), minimum)
        if get(cfg, "token_budget") is not None:
            at_least("data.token_budget", get(cfg, "token_budget"), 1, " (or null: no budget)")
