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
* COMPARABILITY_KEYS (training length, batch, data, model shape) may differ between groups only
  when a sweep varied them on purpose (see mars.analysis.groups.check_comparable).
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
    }
)
IGNORED_PREFIXES = ("logger.", "downstream.", "hydra.")

MODEL_SHAPE_KEYS = ("model.n_layer", "model.n_head", "model.n_embd", "model.block_size", "model.vocab_size")
DATA_KEYS = ("data.name", "data.dir", "data.hf_path", "data.hf_config", "data.paths")
COMPARABILITY_KEYS = ("train.max_steps", "train.global_batch_size", *DATA_KEYS, *MODEL_SHAPE_KEYS)


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
