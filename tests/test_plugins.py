"""mars.plugins: modules named in MARS_PLUGINS are imported once, before configs are composed; one that
cannot be imported is one line naming it. (Training with a plugin's optimizer and metric through
train.py: tests/train/test_extensions.py.)"""

from __future__ import annotations

import sys

import pytest

import mars.plugins as plugins


@pytest.fixture
def fresh(monkeypatch, tmp_path):
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
    with pytest.raises(plugins.PluginError) as info:
        plugins.load_plugins()
    message = str(info.value)
    assert "\n" not in message
    assert "MARS_PLUGINS=plugin_bad: cannot import plugin 'plugin_bad'" in message
    assert "RuntimeError: broken on purpose" in message
    monkeypatch.setenv(plugins.ENV, "no_such_module_anywhere")
    with pytest.raises(plugins.PluginError, match="ModuleNotFoundError"):
        plugins.load_plugins()
