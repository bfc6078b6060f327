"""Open a prepared dataset: memory-map its shards after validating them against the manifest.

Checks, each failing with the file and the problem named:
  * the manifest parses and describes uint16 (or, for vocabularies above 65536 tokens, uint32)
    shards of a known format version;
  * every shard exists and holds exactly 2 (4) bytes per token the manifest lists;
  * every shard's sha256 matches the manifest and its largest token id is < the model's vocab_size.

Hashing a large dataset takes a while, so with ``verify="cached"`` (the default) the result of a
successful check is kept in ``.verified.json`` next to the shards, keyed by file size and mtime:
a shard that was rewritten, truncated or edited since is hashed again. ``verify="full"`` always
hashes. The check is mars.data.integrity's, the one the prepare command repairs by: a missing or
damaged shard's error names the exact prepare command, which rebuilds just the damaged shards.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mars.checks import choice, reported_as
from mars.data.config import VERIFY_LEVELS, DataConfig
from mars.data.integrity import VERIFIED, VerifiedCache, check_shard_file
from mars.data.layout import (
    DTYPES,
    FORMAT_VERSION,
    MANIFEST,
    SPLITS,
    as_data_config,
    config_from_manifest,
    prepare_command,
    read_json,
    read_lock,
)
from mars.data.prepare import ensure_prepared, prepare, prepared_on_first_use
from mars.errors import DamagedShardError, ManifestError

__all__ = ["VERIFIED", "TokenDataset", "open_dataset", "open_dir", "read_manifest"]

log = logging.getLogger(__name__)


@dataclass
class TokenDataset:
    """A prepared dataset: memory-mapped token shards per split and the manifest they were checked with."""

    path: Path
    manifest: dict[str, Any]
    train: list[np.memmap] = field(default_factory=list)
    val: list[np.memmap] = field(default_factory=list)

    @property
    def train_tokens(self) -> int:
        return sum(len(a) for a in self.train)

    @property
    def val_tokens(self) -> int:
        return sum(len(a) for a in self.val)

    @property
    def train_digest(self) -> str:
        """Which training documents, in which order: a digest of the training shards' recorded sha256
        (and the validation split they were cut around). A resume checks it (BatchLoader): a dataset
        re-split (resplit=true) or rebuilt since the checkpoint would feed the run other documents."""
        import hashlib
        import json

        shards = [e.get("sha256") for e in self.manifest["splits"]["train"]["shards"]]
        text = json.dumps([shards, self.manifest.get("val_split")], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of ``directory``, checked for the fields the loader relies on."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise ManifestError(
            f"{path} is missing: {directory} is not a prepared dataset (or its preparation is unfinished)"
        )
    manifest = read_json(path)
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ManifestError(
            f"{path}: format_version {manifest.get('format_version')!r} is not {FORMAT_VERSION}; "
            f"prepare the dataset again with this version of mars"
        )
    if manifest.get("dtype") not in DTYPES:
        raise ManifestError(
            f"{path}: dtype {manifest.get('dtype')!r} is not supported; shards must be {' or '.join(DTYPES)}"
        )
    splits = manifest.get("splits")
    for split in SPLITS:
        shards = (splits or {}).get(split, {}).get("shards")
        if not isinstance(shards, list) or not all(
            isinstance(s, dict) and {"file", "tokens", "sha256"} <= set(s) for s in shards
        ):
            raise ManifestError(
                f"{path}: splits.{split}.shards must be a list of {{file, tokens, sha256}} entries"
            )
    if not splits["train"]["shards"]:
        raise ManifestError(f"{path}: the train split has no shards")
    return manifest


def _prepare_command(directory: Path, manifest: dict[str, Any], cfg: DataConfig | None) -> str:
    """The command that rebuilds ``directory``: ``cfg``'s, or one made from the manifest's record."""
    return prepare_command(
        cfg if cfg is not None else config_from_manifest(directory, manifest.get("config", {}))
    )


def check_shard(
    path: Path,
    entry: dict[str, Any],
    vocab_size: int,
    cache: VerifiedCache,
    command: Callable[[], str],
    dtype: str = "uint16",
) -> None:
    """Validate one shard against its manifest entry; ``command()`` is the prepare command rebuilding it."""
    check = check_shard_file(path, int(entry["tokens"]), entry["sha256"], cache, dtype=dtype)
    if not check.ok:
        raise DamagedShardError(f"{check.message}. Run `{command()}` to rebuild it (intact shards are kept).")
    top = check.max_token
    assert top is not None  # an intact shard's largest token id is known (hashed or cached)
    if top >= vocab_size:
        raise ManifestError(
            f"{path}: holds token id {top} >= vocab_size {vocab_size}. "
            f"The shard was made with another tokenizer "
            f"or the model's vocabulary is too small; prepare the data with the model's tokenizer "
            f"(data.tokenizer) or raise model.vocab_size."
        )


def open_dir(
    directory: str | os.PathLike,
    vocab_size: int = 50304,
    verify: str = "cached",
    cfg: DataConfig | None = None,
) -> TokenDataset:
    """Validate and memory-map the prepared dataset in ``directory``.

    ``cfg``, the config it was prepared from, makes the advice on a damaged shard name the exact
    prepare command; without it the command is rebuilt from the manifest's record.
    """
    with reported_as(ManifestError):
        choice("data.verify", verify, VERIFY_LEVELS)
    directory = Path(directory)
    manifest = read_manifest(directory)
    cache = VerifiedCache(directory, enabled=verify == "cached")
    arrays: dict[str, list[np.memmap]] = {}
    try:
        for split in SPLITS:
            arrays[split] = []
            for entry in manifest["splits"][split]["shards"]:
                path = directory / entry["file"]
                check_shard(
                    path,
                    entry,
                    vocab_size,
                    cache,
                    lambda: _prepare_command(directory, manifest, cfg),
                    dtype=manifest["dtype"],
                )
                shape = (int(entry["tokens"]),)
                arrays[split].append(
                    np.memmap(path, dtype=np.dtype(manifest["dtype"]), mode="r", shape=shape)
                )
    finally:
        cache.save()  # what did verify is remembered even when a later shard fails
    return TokenDataset(path=directory, manifest=manifest, train=arrays["train"], val=arrays["val"])


def open_dataset(cfg: DataConfig, vocab_size: int = 50304) -> TokenDataset:
    """Prepare ``cfg``'s dataset if it is the embedded corpus, then validate and memory-map its shards.

    A damaged shard of the embedded corpus is rebuilt on the spot (it takes seconds); any other
    dataset's raises DamagedShardError naming the prepare command that rebuilds it.
    """
    cfg = as_data_config(cfg)
    directory = ensure_prepared(cfg)
    try:
        dataset = open_dir(directory, vocab_size=vocab_size, verify=cfg.verify, cfg=cfg)
    except DamagedShardError:
        if not prepared_on_first_use(cfg):
            raise
        log.warning("the %s corpus in %s has a missing or damaged shard: rebuilding it", cfg.name, directory)
        prepare(cfg)
        dataset = open_dir(directory, vocab_size=vocab_size, verify=cfg.verify, cfg=cfg)
    fd = read_lock(directory)  # held while its training shards are mapped: resplit=true refuses meanwhile
    if fd is not None:
        weakref.finalize(dataset.train[0] if dataset.train else dataset, os.close, fd)
    return dataset
