"""mars.plugins: modules named in MARS_PLUGINS are imported once, before configs are composed; one that
cannot be imported is one line naming it. (Training with a plugin's optimizer and metric through
train.py: tests/train/test_extensions.py.)"""

from __future__ import annotations

import sys

import pytest

import mars.plugins as plugins


@pytest.fixture
def registries(monkeypatch):
    """Every registry as it is, restored after the test (a registration that gets through is dropped)."""
    from mars.data import registry as sources
    from mars.model import spec
    from mars.optim import registry as optimizers
    from mars.train import metrics

    spec.arch_names(), sources.source_names()  # the built-ins first
    for module, name in ((spec, "_REGISTRY"), (optimizers, "_REGISTRY"), (sources, "_registry")):
        monkeypatch.setattr(module, name, dict(getattr(module, name)))
    monkeypatch.setattr(metrics, "_REGISTERED", {})


@pytest.fixture
def fresh(registries, monkeypatch, tmp_path):
    """No plugin loaded yet, tmp_path importable, every registry restored afterwards."""
    monkeypatch.setattr(plugins, "_loaded", [])
    monkeypatch.setattr(plugins, "_done", False)
    monkeypatch.setattr(plugins, "_entry_points", lambda: [])
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("plugin_a", "plugin_b", "plugin_bad"):
        sys.modules.pop(name, None)


def test_plugins_are_imported_once_in_order(fresh, monkeypatch):
    (fresh / "plugin_a.py").write_text(
        "import builtins\nbuiltins.__dict__.setdefault('_mars_seen', []).append('a')\n"
    )
    (fresh / "plugin_b.py").write_text(
        "import builtins\nbuiltins.__dict__.setdefault('_mars_seen', []).append('b')\n"
    )
    monkeypatch.setenv(plugins.ENV, " plugin_a, ,plugin_b ")
    import builtins

    monkeypatch.setattr(builtins, "_mars_seen", [], raising=False)
    assert plugins.plugin_names() == ["plugin_a", "plugin_b"]
    assert plugins.load_plugins() == ["plugin_a", "plugin_b"]
    assert plugins.load_plugins() == ["plugin_a", "plugin_b"]
    assert builtins._mars_seen == ["a", "b"]


def test_a_plugin_that_cannot_be_imported_is_one_line_naming_it(fresh, monkeypatch):
    (fresh / "plugin_bad.py").write_text("raise RuntimeError('broken on purpose\\nsecond line')\n")
    monkeypatch.setenv(plugins.ENV, "plugin_bad")
    with pytest.raises(plugins.ConfigError) as info:
        plugins.load_plugins()
    message = str(info.value)
    assert "\n" not in message
    assert "MARS_PLUGINS=plugin_bad: cannot import plugin 'plugin_bad'" in message
    assert "RuntimeError: broken on purpose" in message
    monkeypatch.setenv(plugins.ENV, "no_such_module_anywhere")
    with pytest.raises(plugins.ConfigError, match="ModuleNotFoundError"):
        plugins.load_plugins()


# ----------------------------------------------------------------------------- a name is registered once

# Plugins that take a built-in's name. The architecture's config class has the built-in's class name
# (GPTConfig), the optimizer reuses the built-in's config class with its own function.
TAKEOVERS = {
    "arch": """
import dataclasses
from mars.model.gpt import GPT, GPTConfig as Base
from mars.model.spec import arch, register_arch

@dataclasses.dataclass
class GPTConfig(Base):
    pass

class MyGPT(GPT):
    pass

register_arch(dataclasses.replace(arch("gpt2"), config=GPTConfig, model=MyGPT))
""",
    "optimizer": """
import torch
from mars.optim import AdamWConfig, register

def my_adamw(params, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=None):
    return torch.optim.SGD(params, lr=lr)

register("adamw", AdamWConfig, my_adamw, grouping="decay")
""",
    "source": """
from mars.data import register_source
from mars.data.local import LocalSource

class OpenWebText(LocalSource):
    pass

register_source("openwebtext", OpenWebText)
""",
    "metric": """
from mars.train.metrics import register_metric

def weights_rms(model, optimizer):
    return 1.0

register_metric("weights/rms", weights_rms)
""",
}
# what each refusal names: what holds the name and its module(s), and the newcomer from the plugin
NAMED = {
    "arch": (
        "architecture 'gpt2'",
        "mars.model.gpt.GPTConfig, mars.model.gpt.GPT) by mars.model.gpt",
        "plugin_a.GPTConfig, plugin_a.MyGPT",
    ),
    "optimizer": ("optimizer 'adamw'", "mars.optim.adamw.adamw) by mars.optim.adamw", "plugin_a.my_adamw"),
    "source": (
        "data source 'openwebtext'",
        "mars.data.sources.OpenWebText) by mars.data.sources",
        "plugin_a.OpenWebText",
    ),
    "metric": ("metric 'weights/rms'", "plugin_b.weights_rms) by plugin_b", "plugin_a.weights_rms"),
}


@pytest.mark.parametrize("kind", list(TAKEOVERS))
def test_a_plugin_cannot_replace_a_registered_name(kind, fresh, monkeypatch):
    (fresh / "plugin_a.py").write_text(TAKEOVERS[kind])
    # the metric's name is taken by another plugin first (no metric is built in)
    (fresh / "plugin_b.py").write_text(TAKEOVERS["metric"])
    monkeypatch.setenv(plugins.ENV, "plugin_b,plugin_a" if kind == "metric" else "plugin_a")
    with pytest.raises(plugins.ConfigError) as info:
        plugins.load_plugins()
    message = str(info.value)
    what, holder, newcomer = NAMED[kind]
    assert "\n" not in message
    assert (
        f"plugin 'plugin_a' cannot be loaded: {what} is already registered ({holder}; plugin_a registers "
        f"{newcomer} under the same name, which would silently replace it" in message
    )
    assert message.endswith("register it under a name of its own")


def test_registering_the_same_again_changes_nothing(fresh, monkeypatch):
    """A module imported twice (reloaded: new objects of the same names) registers as before."""
    import importlib

    from mars.data.registry import source_class
    from mars.model.spec import arch
    from mars.optim import registered
    from mars.train import metrics

    (fresh / "plugin_a.py").write_text(
        TAKEOVERS["metric"]
        + """
import dataclasses
import torch
from mars.data import register_source
from mars.data.local import LocalSource
from mars.model.gpt import GPT
from mars.model.spec import arch, register_arch
from mars.optim import AdamWConfig, register

class Lines(LocalSource):
    pass

@dataclasses.dataclass
class SGDConfig:
    name: str = "my_sgd"
    lr: float = 0.1

    def validate(self):
        pass

@dataclasses.dataclass
class TinyConfig(type(arch("gpt2").config())):
    arch: str = "tiny"

register_source("lines", Lines)
register("my_sgd", SGDConfig, torch.optim.SGD, grouping="decay")
register_arch(dataclasses.replace(arch("gpt2"), name="tiny", config=TinyConfig))
"""
    )
    module = importlib.import_module("plugin_a")
    importlib.reload(module)
    assert source_class("lines") is module.Lines and registered("my_sgd").config is module.SGDConfig
    assert (
        arch("tiny").config is module.TinyConfig and metrics._REGISTERED["weights/rms"] is module.weights_rms
    )


def test_a_metric_cannot_take_a_key_the_trainer_writes(registries):
    from mars.train import metrics

    for key in metrics.TRAINER_KEYS:
        with pytest.raises(plugins.ConfigError, match=rf"mars.train.trainer writes '{key}' itself"):
            metrics.register_metric(key, lambda model, optimizer: 0.0)
    with pytest.raises(plugins.ConfigError, match="writes 'mars/c_norm_mean' itself"):
        metrics.register_metric("mars/c_norm_mean", lambda model, optimizer: 0.0)
    assert metrics._REGISTERED == {}


PLUGIN_CONFIGS = {
    "no_validate": (
        """
import dataclasses
import torch
from mars.optim import register

@dataclasses.dataclass
class SGDConfig:
    name: str = "my_sgd"
    lr: float = 0.1

register("my_sgd", SGDConfig, torch.optim.SGD, grouping="decay")
""",
        "MARS_PLUGINS=plugin_a: plugin 'plugin_a' cannot be loaded: register('my_sgd'): "
        "plugin_a.SGDConfig has no validate() method; give it one",
    ),
    "field_type": (
        """
import dataclasses
import torch
from mars.optim import register

@dataclasses.dataclass
class SGDConfig:
    name: str = "my_sgd"
    lr: float = 0.1
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))

    def validate(self):
        pass

def sgd(params, lr=0.1, device=None):
    return torch.optim.SGD(params, lr=lr)

register("my_sgd", SGDConfig, sgd, grouping="decay")
""",
        "optimizer=my_sgd: optimizer.device of plugin_a.SGDConfig cannot be a config field (Unexpected type "
        "annotation: device): give it a type a Hydra config holds",
    ),
    "takeover": (TAKEOVERS["optimizer"], "optimizer 'adamw' is already registered (mars.optim.adamw.adamw)"),
}


@pytest.mark.parametrize("case", list(PLUGIN_CONFIGS))
def test_train_py_stops_on_a_plugin_that_cannot_work_in_one_line(
    case, fresh, registries, monkeypatch, capsys
):
    """train.py: exit status 2 and one line naming the plugin's key or class and the fix, before any
    config is composed."""
    from mars.train import cli

    text, fragment = PLUGIN_CONFIGS[case]
    (fresh / "plugin_a.py").write_text(text)
    monkeypatch.setenv(plugins.ENV, "plugin_a")
    tiny = [
        "model.n_layer=1",
        "model.n_head=2",
        "model.n_embd=32",
        "model.block_size=32",
        "train.max_steps=1",
    ]
    tiny += [
        "schedule.warmup_steps=0",
        "train.eval_steps=0",
        "logger=disabled",
        f"data.root={fresh / 'data'}",
    ]
    monkeypatch.setattr(sys, "argv", ["train.py", *tiny, f"hydra.run.dir={fresh / 'run'}"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ") and fragment in err, (
        err
    )
    assert not (fresh / "run").exists() and not (fresh / "data").exists()


def test_a_plain_dataclass_optimizer_config_works_in_train_py_and_a_study(
    fresh, registries, monkeypatch, capsys
):
    """A plugin's config as the registry asks for it at the least: a plain dataclass, `name` first, with
    `def validate(self): pass` (no max_steps, no keys() of OptimizerConfig): train.py's checks and a
    study's search over its keys take it, instead of a late TypeError or AttributeError."""
    from mars.study.cli import main
    from mars.train.cli import precheck
    from mars.train.config import register_configs

    (fresh / "plugin_a.py").write_text(
        """
import dataclasses
import torch
from mars.optim import register

@dataclasses.dataclass
class SGDConfig:
    name: str = "my_sgd"
    lr: float = 0.1
    momentum: float = 0.0

    def validate(self):
        pass

def sgd(params, lr=0.1, momentum=0.0):
    return torch.optim.SGD(params, lr=lr, momentum=momentum)

register("my_sgd", SGDConfig, sgd, grouping="decay")
"""
    )
    monkeypatch.setenv(plugins.ENV, "plugin_a")
    register_configs()  # (train.py's main does it first)
    assert precheck(["optimizer=my_sgd", f"hydra.run.dir={fresh / 'run'}"]).cfg.optimizer.name == "my_sgd"
    search = "+study.arms.adamw.search.optimizer.momentum={dist:uniform,lo:0,hi:0.9}"
    args = [
        "study=smoke",
        f"study.dir={fresh / 's'}",
        'study.arms.adamw.overrides=["optimizer=my_sgd"]',
        search,
    ]
    main([*args, "--dry-run"])  # (a refusal would exit)
    assert "dry run: every check passed" in capsys.readouterr().out
