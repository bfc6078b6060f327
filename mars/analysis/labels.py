"""Names for runs and groups: what a legend entry or a table row says.

The rule: a label names only what differs between the runs shown, and for each run only keys its
own optimizer reads. What all of them share goes into one common description (a legend title or
the report's header) instead of being repeated in every entry.

Differences are taken from the overrides the user typed (``.hydra/overrides.yaml`` and Hydra's
config-group choices) where they explain them, e.g. ``optimizer.lr=3e-3`` or ``schedule=wsd``
(which explains every schedule.* key that changed with it); differences no override explains are
named by their config key. An optimizer key that differs only *between* optimizers (AdamW's betas
against MARS's) is implied by the optimizer's name and not shown; one that varies among runs of
the same optimizer (an lr sweep) is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mars.analysis.paper import paper_entry
from mars.analysis.runs import METRICS, Run, load_run
from mars.analysis.settings import (
    SEED_KEYS,
    applies,
    canonical,
    model_key_applies,
    override_settings,
    settings_of,
)
from mars.errors import UserError

OPT_NAMES = {
    "adamw": "AdamW", "lion": "Lion", "muon": "Muon", "moonlight": "Moonlight", "mars_adamw": "MARS-AdamW",
    "mars_lion": "MARS-Lion", "mars_shampoo": "MARS-Shampoo", "mars_m": "MARS-M",
}  # fmt: skip
# MARS types whose title says approx/exact; MARS-M's approx is an ordinary key
_TITLED_APPROX = ("mars_adamw", "mars_lion", "mars_shampoo")
_SHAPE = ("model.arch", "model.n_layer", "model.n_head", "model.n_embd")  # what size_name shows


def format_value(value: Any) -> str:
    """A config value as a label shows it: 0.003, 1e-05, 0.0, true, [0.9, 0.95]. The one number format of
    labels, tables and grouping: a float as the shortest text that reads back as the same float (Python's
    repr), whether the command line said 3e-3 or 0.003; two different values never look alike."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return str(value)


def number_text(text: str) -> str:
    """An override's text as labels show it: a number in format_value's form (3e-3 -> 0.003, 1_000 ->
    1000), anything else (a config group's choice, a list) as typed."""
    for parse in (int, float):
        try:
            return format_value(parse(text))
        except ValueError:
            continue
    return text


def override_value(item: Item, key: str) -> str | None:
    """The value of an override (or config-group choice) as labels show and compare it: a config key's
    value in the item's settings (so optimizer.lr=3e-3 and optimizer.lr=0.003 are one value, 0.003), a
    config group's choice as typed; None where the item has no such override."""
    if key not in item.overrides:
        return None
    if key in item.settings:
        return format_value(item.settings[key])
    return number_text(item.overrides[key])


def optimizer_title(flat: dict[str, Any]) -> str:
    """ "MARS-AdamW (approx)", "AdamW", ... from the flat config."""
    name = flat.get("optimizer.name", "?")
    title = OPT_NAMES.get(str(name), str(name))
    if name in _TITLED_APPROX:
        title += " (approx)" if flat.get("optimizer.approx", True) else " (exact)"
    return title


def _spec(arch_name: Any):
    from mars.model.spec import DEFAULT_ARCH, arch, arch_names

    name = str(arch_name or DEFAULT_ARCH)
    return arch(name) if name in arch_names() else None


def size_name(flat: dict[str, Any]) -> str | None:
    """ "GPT-2 small", "LLaMA 124m", or "4L/256d" ("LLaMA 2L/64d") for a shape that is not a preset;
    the architecture's name (its spec's sizes and title, mars.model.spec); None without model keys."""
    arch_name, *shape = (flat.get(k) for k in _SHAPE)
    if shape[0] is None:
        return None
    spec = _spec(arch_name)
    if spec is None:  # an architecture this version does not know
        return f"{arch_name} {shape[0]}L/{shape[2]}d"
    return spec.size_name(*shape)


def describe(cfg: dict) -> tuple[str, tuple[str, str] | None]:
    """A stand-alone label for one run's nested config, and its paper reference entry if it has one."""
    opt, model = cfg.get("optimizer", {}), cfg.get("model", {})
    flat = {f"optimizer.{k}": v for k, v in opt.items()} | {f"model.{k}": v for k, v in model.items()}
    parts = [optimizer_title(flat), size_name(flat) or "?"]
    if "lr" in opt:
        parts.append(f"lr {format_value(float(opt['lr']))}")
    return ", ".join(parts), paper_entry(cfg)


@dataclass
class Item:
    """What labelling needs of a run or a group: its settings and its overrides (both filtered)."""

    settings: dict[str, Any]
    overrides: dict[str, str]

    @property
    def optimizer(self) -> Any:
        return self.settings.get("optimizer.name")


@dataclass(frozen=True)
class Column:
    """One thing that differs: a facet ("optimizer", "model"), an override key or a config key."""

    key: str
    kind: str  # optimizer | size | override | config
    header: str


def _varies(items: Sequence[Item], key: str) -> bool:
    """Whether a config key takes more than one value; optimizer keys only among runs of one optimizer."""
    if key.startswith("model.") and key not in _SHAPE:
        # a key of one architecture's config varies only among runs of that architecture
        by_arch: dict[str, set[str]] = {}
        for it in items:
            arch_name = it.settings.get("model.arch")
            if model_key_applies(key, arch_name):
                by_arch.setdefault(str(arch_name), set()).add(canonical(it.settings.get(key, "<absent>")))
        return any(len(values) > 1 for values in by_arch.values())
    if key.startswith("optimizer."):
        by_optimizer: dict[str, set[str]] = {}
        for it in items:
            if key in it.settings and not (key == "optimizer.approx" and it.optimizer in _TITLED_APPROX):
                by_optimizer.setdefault(str(it.optimizer), set()).add(canonical(it.settings[key]))
        return any(len(values) > 1 for values in by_optimizer.values())
    return len({canonical(it.settings.get(key, "<absent>")) for it in items}) > 1


def _determined_by(items: Sequence[Item], override: str, value_of: Callable[[Item], Any]) -> bool:
    """Whether items with the same value of `override` always agree on value_of(item)."""
    by_choice: dict[str | None, set[str]] = {}
    for it in items:
        by_choice.setdefault(override_value(it, override), set()).add(canonical(value_of(it)))
    return all(len(values) == 1 for values in by_choice.values())


def varying_columns(items: Sequence[Item]) -> list[Column]:
    """The columns that tell the items apart: facets first, then overrides, then config keys.

    A dotted override (optimizer.lr=...) names its own key. A config-group choice (schedule=wsd,
    model=..., experiment=...) stands for the keys under it (experiment: any key) that it
    determines, i.e. that never differ between items with the same choice; the rest stay
    columns of their own, so two different settings never share a label.
    """
    if len(items) < 2:
        return []
    keys = sorted({k for it in items for k in it.settings})
    size_varies = len({size_name(it.settings) for it in items}) > 1
    # shape keys the size facet does not tell apart (e.g. n_head of a non-preset shape) stay keys
    shape_left = [k for k in _SHAPE if not _determined_by_size(items, k)]
    differing = {k for k in keys if k not in ("optimizer.name", *_SHAPE) and _varies(items, k)}
    differing |= {k for k in shape_left if _varies(items, k)}
    columns: list[Column] = []
    if len({optimizer_title(it.settings) for it in items}) > 1:
        columns.append(Column("optimizer", "optimizer", "optimizer"))
    overrides = sorted({k for it in items for k in it.overrides}, key=lambda k: ("." not in k, k))
    for o in overrides:
        if o == "optimizer" or len({override_value(it, o) for it in items}) < 2:
            continue
        if "." in o:
            covered = {o} & differing
        else:
            candidates = differing if o == "experiment" else {k for k in differing if k.startswith(o + ".")}
            covered = {k for k in candidates if _determined_by(items, o, lambda it, k=k: it.settings.get(k))}
        takes_size = (
            o in ("model", "experiment")
            and size_varies
            and _determined_by(items, o, lambda it: size_name(it.settings))
        )
        if covered or takes_size:
            columns.append(Column(o, "override", o))
            differing -= covered
            size_varies = size_varies and not takes_size
    if size_varies:
        columns.insert(
            1 if columns and columns[0].kind == "optimizer" else 0, Column("model", "size", "model")
        )
    columns += [Column(k, "config", k) for k in sorted(differing)]
    return _short_headers(columns, {*keys, *SEED_KEYS})


def _determined_by_size(items: Sequence[Item], key: str) -> bool:
    """Whether items of the same size name (GPT-2 small, 4L/256d) agree on a shape key."""
    by_size: dict[str | None, set[str]] = {}
    for it in items:
        by_size.setdefault(size_name(it.settings), set()).add(canonical(it.settings.get(key)))
    return all(len(values) == 1 for values in by_size.values())


def _short_headers(columns: list[Column], all_keys: set[str]) -> list[Column]:
    """Headers by the last part of the key (lr, gamma) unless another config key ends the same way
    (data.seed and train.seed, data.name and optimizer.name): then the whole key."""
    endings: dict[str, set[str]] = {}
    for key in {*all_keys, *(c.key for c in columns)}:
        endings.setdefault(key.rsplit(".", 1)[-1], set()).add(key)
    out = []
    for c in columns:
        if c.kind in ("optimizer", "size"):
            out.append(c)
            continue
        short = c.key.rsplit(".", 1)[-1]
        out.append(Column(c.key, c.kind, short if len(endings[short]) == 1 else c.key))
    return out


def cell(column: Column, item: Item) -> str | None:
    """The item's value in a column; None where the key does not apply to it (or it has none)."""
    if column.kind == "optimizer":
        return optimizer_title(item.settings)
    if column.kind == "size":
        return size_name(item.settings)
    if not applies(column.key, item.optimizer):
        return None
    if column.kind == "override" and column.key in item.overrides:
        return override_value(item, column.key)
    if column.key in item.settings:
        return format_value(item.settings[column.key])
    return None


def label(columns: Sequence[Column], item: Item) -> str:
    """ "MARS-AdamW (approx), lr=0.003": the item's values in the columns, keys it lacks left out."""
    parts = []
    for c in columns:
        value = cell(c, item)
        if value is not None:
            parts.append(value if c.kind in ("optimizer", "size") else f"{c.header}={value}")
    return ", ".join(parts)


def common_description(columns: Sequence[Column], items: Sequence[Item]) -> str:
    """What every item shares and the labels therefore leave out: the optimizer and the model size."""
    if not items:
        return ""
    kinds = {c.kind for c in columns} | {c.key for c in columns}
    parts = []
    if "optimizer" not in kinds:
        parts.append(optimizer_title(items[0].settings))
    size = size_name(items[0].settings)
    if "size" not in kinds and "model" not in kinds and "experiment" not in kinds and size:
        parts.append(size)
    return ", ".join(parts)


# ----------------------------------------------------------------------------- runs shown one by one


def item_of(run: Run, keep_seeds: bool = False) -> Item:
    """What labelling needs of a run: its settings and its overrides / config-group choices, filtered."""
    optimizer = run.flat.get("optimizer.name")
    overrides = override_settings({**run.choices, **run.overrides}, optimizer, keep_seeds)
    return Item(settings_of(run.flat, keep_seeds=keep_seeds), overrides)


def run_labels(runs: Sequence[Run | Path]) -> tuple[list[str], str]:
    """Per run (or run dir), a label naming only what differs between these runs (seeds included),
    and the description they share (the legend's title). A single run keeps its stand-alone label."""
    runs = [r if isinstance(r, Run) else load_run(r, with_metrics=False) for r in runs]
    if len(runs) == 1:
        return [describe(runs[0].config)[0]], ""
    items = [item_of(r, keep_seeds=True) for r in runs]
    columns = varying_columns(items)
    return [label(columns, it) for it in items], common_description(columns, items)


def disambiguate(runs: Sequence[Run], dirs: Sequence[Path] | None = None) -> None:
    """Runs whose labels coincide (the same settings, or nothing that differs) get their dir's name."""
    dirs = [r.path for r in runs] if dirs is None else dirs
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.label] = counts.get(r.label, 0) + 1
    for r, path in zip(runs, dirs, strict=True):
        if counts[r.label] > 1 or not r.label:
            name = Path(path).resolve().name
            r.label = f"{r.label} [{name}]" if r.label else name


def read_run(run_dir: Path) -> Run:
    """A run dir with its metrics, labelled on its own (describe); one line of error without a
    metrics.jsonl."""
    if not (run_dir / METRICS).is_file():
        raise UserError(f"{run_dir / METRICS} not found (expected a run dir written by train.py)")
    run = load_run(run_dir)
    run.label = describe(run.config)[0]
    return run
