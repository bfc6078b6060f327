"""Which config keys say *what a run trains*, which say where it lives, and which are seeds.

Grouping, labelling and the comparability checks all start from these lists, so they agree with
each other. The rule, in one place:

* seeds (SEED_KEYS) separate repetitions of one setting: runs that differ only there form a group;
* bookkeeping keys (where a run lives, how it is logged, checkpointed or shown: IGNORED_KEYS,
  IGNORED_PREFIXES) never separate runs and are never shown;
* an optimizer key that the run's optimizer does not take (not a field of its registered config,
  e.g. gamma for AdamW) is dropped: run dirs written before optimizer configs were strict still
  carry such keys, and they must neither split groups nor appear in labels;
* every other key is a setting: runs that differ in one are never averaged together;
* COMPARABILITY_KEYS (training length, batch, data, model architecture and shape: model.arch and
  each architecture's spec.shape_keys, mars.model.spec) may differ between groups only when a sweep
  varied them on purpose (see mars.analysis.groups.check_comparable);
* a run config without model.arch (written before there were two architectures) is GPT-2's.
"""

from __future__ import annotations

import json
from typing import Any

SEED_KEYS = ("train.seed", "train.data_seed")

# where a run lives and how it is logged / checkpointed / shown: not what it trains
IGNORED_KEYS = frozenset(
    {
        "data.root",
        "data.num_workers",  # tokenizer processes when preparing shards
        "data.verify",  # how shard checksums are checked
        "train.resume",
        "train.progress",
        "train.device",
        "train.log_interval",
        "train.ckpt_interval",
        "train.keep_last",
        "train.ckpt_steps",
        # a budget branch computes what a standalone run of its own config computes (docs/training.md):
        # where it forked is its lineage (RUN_DIR/lineage.json, shown apart), not a setting
        "train.fork_from",
    }
)
IGNORED_PREFIXES = ("logger.", "downstream.", "hydra.")

DATA_KEYS = ("data.name", "data.dir", "data.hf_path", "data.hf_config", "data.paths", "data.tokenizer")


def model_shape_keys() -> tuple[str, ...]:
    """model.arch and the shape keys of every registered architecture (mars.model.spec)."""
    from mars.model.spec import arch, arch_names

    keys = dict.fromkeys(["model.arch"])
    for name in arch_names():
        keys.update(dict.fromkeys(f"model.{k}" for k in arch(name).shape_keys))
    return tuple(keys)


def comparability_keys() -> tuple[str, ...]:
    return ("train.max_steps", "train.global_batch_size", *DATA_KEYS, *model_shape_keys())


def with_defaults(flat: dict[str, Any]) -> dict[str, Any]:
    """The flat config with what older run configs leave out: model.arch (gpt2), data.tokenizer (gpt2)."""
    if any(k.startswith("model.") for k in flat) and "model.arch" not in flat:
        flat = {**flat, "model.arch": "gpt2"}
    if any(k.startswith("data.") for k in flat) and "data.tokenizer" not in flat:
        flat = {**flat, "data.tokenizer": "gpt2"}
    return flat


def model_key_applies(key: str, arch_name: Any) -> bool:
    """Whether a model.* key is a field of that architecture's config (an unknown one keeps every key)."""
    from mars.model.spec import arch, arch_names

    if not key.startswith("model.") or str(arch_name) not in arch_names():
        return True
    return key.split(".", 2)[1] in arch(str(arch_name)).config.__dataclass_fields__


def is_ignored(key: str) -> bool:
    """Bookkeeping keys, and the config groups that only hold bookkeeping (logger=..., hydra/...)."""
    return key in IGNORED_KEYS or key.startswith(IGNORED_PREFIXES) or key in ("logger", "downstream", "hydra")


def applies(key: str, optimizer: Any) -> bool:
    """Whether a config key is read by a run with this optimizer (non-optimizer keys always are): the
    keys of its registered config (mars.optim.registry). An optimizer this version does not know keeps
    every key (a setting until someone says otherwise)."""
    if not key.startswith("optimizer."):
        return True
    from mars.optim import optimizer_names, registered

    if str(optimizer) not in optimizer_names():
        return True
    field_name = key.split(".", 2)[1]
    return field_name in registered(str(optimizer)).config.keys()


def settings_of(flat: dict[str, Any], keep_seeds: bool = False) -> dict[str, Any]:
    """The settings of a run: its flat config minus seeds, bookkeeping and keys its optimizer ignores."""
    flat = with_defaults(flat)
    optimizer = flat.get("optimizer.name")
    return {
        k: v
        for k, v in flat.items()
        if (keep_seeds or k not in SEED_KEYS) and not is_ignored(k) and applies(k, optimizer)
    }


def override_settings(overrides: dict[str, str], optimizer: Any, keep_seeds: bool = False) -> dict[str, str]:
    """The same filter for override strings (and config-group choices such as optimizer=adamw)."""
    return {
        k: v
        for k, v in overrides.items()
        if (keep_seeds or k not in SEED_KEYS) and not is_ignored(k) and applies(k, optimizer)
    }


def canonical(value: Any) -> str:
    """A value as a comparable string: 0.003 == 3e-3, [0.9, 0.95] compared by content."""
    return json.dumps(value, sort_keys=True, default=str)
