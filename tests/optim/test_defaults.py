"""Each optimizer default has one home, its config dataclass: the YAML files and the table of
docs/optimizers.md that restate the defaults must agree with it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from mars.optim import optimizer_names, registered

ROOT = Path(__file__).resolve().parents[2]
YAMLS = sorted((ROOT / "configs" / "optimizer").glob("*.yaml"))


def defaults(name: str) -> dict:
    config = registered(name).config()
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


@pytest.mark.parametrize("path", YAMLS, ids=[p.stem for p in YAMLS])
def test_every_value_an_optimizer_yaml_sets_is_its_dataclass_default(path):
    name = path.stem
    assert name in optimizer_names()
    values = yaml.safe_load(path.read_text())
    values.pop("defaults")
    want = defaults(name)
    wrong = {k: (v, want.get(k, "no such key")) for k, v in values.items() if want.get(k, object()) != v}
    assert not wrong, f"{path}: value (yaml, {registered(name).config.__name__}) {wrong}"


# "KEY VALUE" in the table's "other" column, for the keys the table states there
PAIR = r"\b(gamma|eps|lr_1d|betas_1d|weight_decay_1d) (\([^)]*\)|[\d.e-]+)"


def _numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?:e-?\d+)?", text)]


def _table() -> dict[str, list[str]]:
    """The rows of docs/optimizers.md's reference table: optimizer name -> its cells."""
    text = (ROOT / "docs" / "optimizers.md").read_text()
    section = text.split("## Reference hyperparameters", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `(\w+)` \|", line)
        if m:
            rows[m[1]] = [c.strip() for c in line.strip("|").split("|")]
    return rows


def test_the_docs_table_of_reference_hyperparameters_is_the_dataclass_defaults():
    """Columns: optimizer, class, lr, betas / momentum, weight decay, other (key value pairs), state."""
    rows = _table()
    assert rows and set(rows) <= set(optimizer_names())
    for name, (_, _, lr, betas, wd, other, _) in rows.items():
        want = defaults(name)
        assert _numbers(lr)[0] == want["lr"], (name, "lr")
        assert _numbers(wd)[0] == want["weight_decay"], (name, "weight_decay")
        if "momentum" in betas:
            assert _numbers(betas)[0] == want["momentum"], (name, "momentum")
        else:
            assert _numbers(betas) == want["betas"], (name, "betas")
        if other.startswith("as "):  # "as mars_adamw": the same values
            other = rows[other.split()[1].rstrip(";")][5] + other
        for key, value in re.findall(PAIR, other):
            want_value = want[key] if isinstance(want[key], list) else [want[key]]
            assert _numbers(value) == want_value, (name, key)
        if "Nesterov" in betas:
            assert want["nesterov"] is True, name
