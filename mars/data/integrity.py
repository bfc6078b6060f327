"""Is a shard file still the one that was written? Size and sha256 against a record, with a cache.

One check serves the three places that ask: opening a dataset for training (mars.data.shards),
resuming an interrupted preparation, and the prepare command on a finished directory, which
rebuilds what fails it (mars.data.writer). The size is always compared. Hashing a large dataset
takes a while, so a file that hashed right is remembered in ``.verified.json`` next to the shards,
keyed by its size and mtime, together with a hash of every 1 MiB block of it: a file that was
rewritten, truncated or edited since is hashed again; an untouched one costs a ``stat`` and reading a
sample of its blocks (the first, the last and 8 chosen at random, each open), whose hashes must still
match. So a file changed in place with its size and mtime kept is caught when the change falls into a
sampled block: always for shards of up to 10 MiB, for a larger one with a chance that grows with the
part changed and with every open; ``data.verify=full`` hashes every byte (docs/reliability.md).
"""

from __future__ import annotations

import hashlib
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mars.data.layout import DTYPE, read_json, write_json
from mars.errors import ManifestError

VERIFIED = ".verified.json"
HASH_CHUNK = 1 << 23  # tokens per read while hashing (16 MiB)
BLOCK_BYTES = 1 << 20  # the unit of the sampled quick check (HASH_CHUNK * 2 is a multiple of it)
SAMPLED_BLOCKS = 8  # random blocks read per file and open, besides the first and the last


def _block_hash(data) -> str:
    import xxhash

    return xxhash.xxh3_64(data).hexdigest()


def hash_shard(path: Path, tokens: int, dtype: str = DTYPE) -> tuple[str, int, list[str]]:
    """sha256 of a shard of ``tokens`` tokens (uint16 or uint32), its largest token id and the hash of
    each of its BLOCK_BYTES blocks, read in bounded chunks."""
    data = np.memmap(path, dtype=np.dtype(dtype), mode="r", shape=(tokens,))
    h = hashlib.sha256()
    top = 0
    blocks = []
    for i in range(0, tokens, HASH_CHUNK):
        chunk = np.asarray(data[i : i + HASH_CHUNK])
        view = memoryview(chunk).cast("B")
        h.update(view)
        blocks.extend(_block_hash(view[j : j + BLOCK_BYTES]) for j in range(0, len(view), BLOCK_BYTES))
        top = max(top, int(chunk.max()))
    del data
    return h.hexdigest(), top, blocks


def sampled_blocks(count: int) -> list[int]:
    """The blocks the quick check reads: all of a small file, else the first, the last and some at random."""
    if count <= SAMPLED_BLOCKS + 2:
        return list(range(count))
    chosen = random.SystemRandom().sample(range(1, count - 1), SAMPLED_BLOCKS)
    return sorted({0, count - 1, *chosen})


def blocks_agree(path: Path, blocks: list[str]) -> bool:
    """The sampled blocks of ``path`` still hash to the recorded ``blocks``."""
    try:
        with open(path, "rb") as f:
            for i in sampled_blocks(len(blocks)):
                f.seek(i * BLOCK_BYTES)
                if _block_hash(f.read(BLOCK_BYTES)) != blocks[i]:
                    return False
    except OSError:
        return False
    return True


class VerifiedCache:
    """``.verified.json``: name -> size, mtime_ns, sha256, largest token id and block hashes of each file
    that hashed right.

    ``enabled=False`` (``data.verify=full``) neither reads nor writes it, so every file is hashed.
    """

    def __init__(self, directory: Path, enabled: bool = True):
        self.path = directory / VERIFIED
        self.enabled = enabled
        self.entries: dict[str, Any] = {}
        self.dirty = False
        if enabled:
            try:
                self.entries = read_json(self.path)
            except ManifestError:  # absent or unreadable: nothing is known to be verified
                self.entries = {}

    def max_token(self, path: Path, sha256: str, stat: os.stat_result) -> int | None:
        """The cached largest token id when ``path`` is unchanged since it hashed to ``sha256`` (same size,
        mtime, and sampled blocks), else None."""
        entry = self.entries.get(path.name) if self.enabled else None
        blocks = entry.get("blocks") if isinstance(entry, dict) else None
        if (
            isinstance(entry, dict)
            and entry.get("size") == stat.st_size
            and entry.get("mtime_ns") == stat.st_mtime_ns
            and entry.get("sha256") == sha256
            and isinstance(entry.get("max_token"), int)
            and isinstance(blocks, list)
            and len(blocks) == -(-stat.st_size // BLOCK_BYTES)
            and blocks_agree(path, blocks)
        ):
            return entry["max_token"]
        return None

    def remember(
        self, path: Path, sha256: str, max_token: int, stat: os.stat_result, blocks: list[str]
    ) -> None:
        if self.enabled:
            self.entries[path.name] = {
                "size": stat.st_size,
                "mtime_ns": stat.st_mtime_ns,
                "sha256": sha256,
                "max_token": max_token,
                "blocks": blocks,
            }
            self.dirty = True

    def forget(self, name: str) -> None:
        """Drop ``name`` (a rewritten file): it is hashed again, from disk, the next time it is checked."""
        if self.entries.pop(name, None) is not None:
            self.dirty = True

    def save(self) -> None:
        if self.enabled and self.dirty:
            try:
                write_json(self.path, self.entries)
            except OSError:  # a read-only dataset directory: verification simply is not cached
                pass
            self.dirty = False


@dataclass(frozen=True)
class ShardCheck:
    """The outcome of checking one shard file against the record of what was written there."""

    path: Path
    problem: str | None  # None when the file is intact
    short: str = ""  # the problem in a few words, for "repaired ..." lines
    max_token: int | None = None  # known when the file is intact

    @property
    def ok(self) -> bool:
        return self.problem is None

    @property
    def message(self) -> str:
        """``path`` and its problem, e.g. "data/x/train_000001.bin: has 2998 bytes but ..."."""
        return f"{self.path} {self.problem}" if self.short == "missing" else f"{self.path}: {self.problem}"


def check_shard_file(
    path: Path,
    tokens: int,
    sha256: str,
    cache: VerifiedCache,
    listed_in: str = "the manifest",
    dtype: str = DTYPE,
) -> ShardCheck:
    """Compare ``path`` with its record (``tokens`` tokens of ``dtype`` hashing to ``sha256``, in
    ``listed_in``).

    The size is always compared; the hash is taken from ``cache`` when the file is unchanged since it
    last hashed right, else computed (and remembered in ``cache`` when it matches).
    """
    try:
        stat = path.stat()
    except FileNotFoundError:
        return ShardCheck(path, f"is missing (listed in {listed_in})", "missing")
    width = np.dtype(dtype).itemsize
    if stat.st_size != width * tokens:
        other = 4 if width == 2 else 2  # the other shard width (uint16 <-> uint32)
        if stat.st_size == other * tokens:
            problem = (
                f"holds {stat.st_size} bytes = {other} bytes per token (uint{8 * other}?) but {listed_in} "
                f"says {dtype}"
            )
        else:
            problem = (
                f"has {stat.st_size} bytes but {listed_in} lists {tokens} {dtype} tokens = {width * tokens} "
                "bytes"
            )
        return ShardCheck(path, problem, f"had {stat.st_size} bytes instead of {width * tokens}")
    top = cache.max_token(path, sha256, stat)
    if top is not None:
        return ShardCheck(path, None, max_token=top)
    digest, top, blocks = hash_shard(path, tokens, dtype)
    if digest != sha256:
        return ShardCheck(
            path,
            f"sha256 {digest} does not match {listed_in}'s {sha256}: the file is corrupted or was changed",
            f"its sha256 did not match {listed_in}",
        )
    cache.remember(path, sha256, top, stat, blocks)
    return ShardCheck(path, None, max_token=top)
