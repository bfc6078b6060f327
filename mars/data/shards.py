"""Open a prepared dataset: memory-map its shards after validating them against the manifest.

Checks, each failing with the file and the problem named:
  * the manifest parses and describes uint16 shards of a known format version;
  * every shard exists and holds exactly 2 bytes per token the manifest lists (4 bytes per token
    is reported as a uint32 shard);
  * every shard's sha256 matches the manifest and its largest token id is < the model's vocab_size.

Hashing a large dataset takes a while, so with ``verify="cached"`` (the default) the result of a
successful check is kept in ``.verified.json`` next to the shards, keyed by file size and mtime:
a shard that was rewritten, truncated or edited since is hashed again. ``verify="full"`` always
hashes.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mars.data.config import DataConfig
from mars.data.errors import ManifestError, ShardError
from mars.data.layout import (
    DTYPE,
    FORMAT_VERSION,
    MANIFEST,
    SPLITS,
    as_data_config,
    read_json,
    write_json_atomic,
)
from mars.data.prepare import ensure_prepared

VERIFIED = ".verified.json"
_HASH_CHUNK = 1 << 23  # tokens per read while hashing (16 MiB)


@dataclass
class TokenDataset:
    """A prepared dataset: memory-mapped uint16 shards per split and the manifest they were checked with."""

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
    if manifest.get("dtype") != DTYPE:
        raise ManifestError(
            f"{path}: dtype {manifest.get('dtype')!r} is not supported; shards must be {DTYPE}"
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


def _hash_and_max(path: Path, tokens: int) -> tuple[str, int]:
    data = np.memmap(path, dtype=np.uint16, mode="r", shape=(tokens,))
    h = hashlib.sha256()
    top = 0
    for i in range(0, tokens, _HASH_CHUNK):
        chunk = np.asarray(data[i : i + _HASH_CHUNK])
        h.update(memoryview(chunk))
        top = max(top, int(chunk.max()))
    del data
    return h.hexdigest(), top


def _load_cache(directory: Path) -> dict[str, Any]:
    try:
        return read_json(directory / VERIFIED)
    except ManifestError:
        return {}


def check_shard(
    path: Path, entry: dict[str, Any], vocab_size: int, cache: dict[str, Any], verify: str
) -> bool:
    """Validate one shard against its manifest entry; returns True when ``cache`` was updated."""
    tokens = int(entry["tokens"])
    if not path.is_file():
        raise ShardError(f"{path} is missing (listed in {path.parent / MANIFEST}); prepare the dataset again")
    size = path.stat().st_size
    if size != 2 * tokens:
        if size == 4 * tokens:
            problem = f"holds {size} bytes = 4 bytes per token (uint32?) but the manifest says {DTYPE}"
        else:
            problem = f"has {size} bytes but the manifest lists {tokens} {DTYPE} tokens = {2 * tokens} bytes"
        raise ShardError(f"{path}: {problem}. Delete it and re-run the prepare command.")
    stat = path.stat()
    key = path.name
    cached = cache.get(key)
    fresh = (
        verify == "cached"
        and isinstance(cached, dict)
        and cached.get("size") == size
        and cached.get("mtime_ns") == stat.st_mtime_ns
        and cached.get("sha256") == entry["sha256"]
    )
    if fresh:
        top = int(cached["max_token"])
    else:
        digest, top = _hash_and_max(path, tokens)
        if digest != entry["sha256"]:
            raise ShardError(
                f"{path}: sha256 {digest} does not match the manifest's {entry['sha256']}: "
                f"the file is corrupted "
                f"or was changed. Delete it and re-run the prepare command (finished shards are kept)."
            )
    if top >= vocab_size:
        raise ShardError(
            f"{path}: holds token id {top} >= vocab_size {vocab_size}. "
            f"The shard was made with another tokenizer "
            f"or the model's vocabulary is too small; prepare the data with the GPT-2 tokenizer or raise "
            f"model.vocab_size."
        )
    if not fresh:
        cache[key] = {"size": size, "mtime_ns": stat.st_mtime_ns, "sha256": entry["sha256"], "max_token": top}
        return True
    return False


def open_dir(directory: str | os.PathLike, vocab_size: int = 50304, verify: str = "cached") -> TokenDataset:
    """Validate and memory-map the prepared dataset in ``directory``."""
    if verify not in ("cached", "full"):
        raise ManifestError(f"data.verify={verify!r} is not one of cached, full")
    directory = Path(directory)
    manifest = read_manifest(directory)
    cache = _load_cache(directory) if verify == "cached" else {}
    changed = False
    arrays: dict[str, list[np.memmap]] = {}
    for split in SPLITS:
        arrays[split] = []
        for entry in manifest["splits"][split]["shards"]:
            path = directory / entry["file"]
            changed |= check_shard(path, entry, vocab_size, cache, verify)
            arrays[split].append(np.memmap(path, dtype=np.uint16, mode="r", shape=(int(entry["tokens"]),)))
    if changed and verify == "cached":
        try:
            write_json_atomic(directory / VERIFIED, cache)
        except OSError:  # a read-only dataset directory: verification simply is not cached
            pass
    return TokenDataset(path=directory, manifest=manifest, train=arrays["train"], val=arrays["val"])


def open_dataset(cfg: DataConfig, vocab_size: int = 50304) -> TokenDataset:
    """Prepare ``cfg``'s dataset if it is the embedded corpus, then validate and memory-map its shards."""
    cfg = as_data_config(cfg)
    return open_dir(ensure_prepared(cfg), vocab_size=vocab_size, verify=cfg.verify)
