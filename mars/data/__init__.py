"""Data: the offline GPT-2 tokenizer, dataset sources, token shards and batch loaders.

Heavy submodules (torch for the loaders, numpy for shards) load on first attribute access, so
the tokenizer worker processes of a preparation start fast. ``register_source`` adds a data source
(docs/data.md, "Adding a dataset"); importing it loads nothing else.
"""

from __future__ import annotations

import importlib

from mars.data.config import DataConfig
from mars.data.registry import register_source, source_names
from mars.data.tokenizer import EOT_ID, VOCAB_SIZE, get_hf_tokenizer, get_tokenizer
from mars.errors import DamagedShardError, DataError, ManifestError, SourceChangedError

_LAZY = {
    "Source": "mars.data.sources",
    "dataset_dir": "mars.data.layout",
    "prepare_command": "mars.data.layout",
    "prepare": "mars.data.prepare",
    "ensure_prepared": "mars.data.prepare",
    "open_dataset": "mars.data.shards",
    "open_dir": "mars.data.shards",
    "TokenDataset": "mars.data.shards",
    "BatchLoader": "mars.data.loader",
    "ValLoader": "mars.data.loader",
}

__all__ = [
    "EOT_ID",
    "VOCAB_SIZE",
    "DamagedShardError",
    "DataConfig",
    "DataError",
    "ManifestError",
    "SourceChangedError",
    "get_hf_tokenizer",
    "get_tokenizer",
    "register_source",
    "source_names",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mars.data' has no attribute {name!r}")
