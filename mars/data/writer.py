"""Tokenize a stream of documents into uint16 token shards, resumably, and write the manifest.

Every document is followed by <|endoftext|>. The last validation document is cut at val_tokens and
its remainder dropped, so no document is in both splits. Shards are written under a temporary name,
fsync'ed and renamed, and recorded in progress.json only after the rename: an interrupted run leaves
only finished shards under final names, and a re-run verifies them (size + sha256), skips them, and
restarts the document stream exactly where the last finished shard ends. The manifest comes last.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import os
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mars.data.errors import ManifestError, SourceError
from mars.data.layout import (
    DTYPE,
    FORMAT_VERSION,
    IDENTITY_KEYS,
    MANIFEST,
    PROGRESS,
    SIZE_KEYS,
    SPLITS,
    TMP_RE,
    config_differences,
    read_json,
    sha256_file,
    write_json_atomic,
)
from mars.data.tokenizer import EOT_ID, VOCAB_SIZE, get_tokenizer

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- tokenization


def encode_documents(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of ``texts``, each followed by <|endoftext|>, as one uint16 array, plus each document's length.

    Blank documents (e.g. empty lines of a text file read by line) contribute nothing, not even an EOT.
    """
    ids = get_tokenizer().encode_ordinary_batch(texts, num_threads=1)
    lengths = np.fromiter(
        (len(d) + 1 if t.strip() else 0 for t, d in zip(texts, ids, strict=True)), np.int64, len(ids)
    )
    out = np.empty(int(lengths.sum()), dtype=np.uint16)
    pos = 0
    for doc, length in zip(ids, lengths, strict=True):
        if length:
            out[pos : pos + length - 1] = doc
            out[pos + length - 1] = EOT_ID
            pos += length
    return out, lengths


def _init_worker() -> None:
    get_tokenizer()


def tokenize_batches(batches: Iterator[list[str]], workers: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``encode_documents`` over ``batches`` in ``workers`` processes, results in input order.

    At most ``2 * workers + 2`` batches are in flight, so memory stays bounded on any dataset size.
    """
    if workers <= 1:
        for texts in batches:
            yield encode_documents(texts)
        return
    # spawn, not fork: the parent may hold threads (datasets' streaming, torch) that fork would copy mid-lock.
    with mp.get_context("spawn").Pool(workers, initializer=_init_worker) as pool:
        pending: deque = deque()
        for texts in batches:
            pending.append(pool.apply_async(encode_documents, (texts,)))
            if len(pending) >= 2 * workers + 2:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ----------------------------------------------------------------------------- shard writing


class ShardWriter:
    """Routes the token stream into shards and writes each finished shard atomically.

    The first ``val_tokens`` tokens go to the val split (the document they end in is cut there and
    its remainder dropped), everything after to train, ``shard_tokens`` per shard, up to
    ``token_budget`` train tokens. Every finished shard is recorded in progress.json together with
    the stream position (document, token offset) where the next shard starts.
    """

    def __init__(
        self,
        directory: Path,
        progress: dict[str, Any],
        val_tokens: int,
        shard_tokens: int,
        token_budget: int | None,
    ):
        self.directory = directory
        self.progress = progress
        self.shard_tokens = shard_tokens
        self.capacity = {"val": val_tokens, "train": float("inf") if token_budget is None else token_budget}
        self.split = "val" if self.written("val") < val_tokens else "train"
        self.buffer: np.ndarray | None = None
        self.filled = 0

    def records(self, split: str) -> list[dict[str, Any]]:
        return [r for r in self.progress["shards"] if r["split"] == split]

    def written(self, split: str) -> int:
        return sum(r["tokens"] for r in self.records(split))

    @property
    def done(self) -> bool:
        """True once the token budget is reached: nothing more will be written."""
        return self.split == "train" and self.written("train") >= self.capacity["train"]

    def feed(self, tokens: np.ndarray, lengths: np.ndarray, first_doc: int, start: int = 0) -> int:
        """Take ``tokens[start:]``: documents ``first_doc, first_doc + 1, ...`` of ``lengths`` tokens each.

        Returns how many tokens were written (or buffered).
        """
        doc_ends = np.cumsum(lengths)
        cursor, taken = start, 0
        while cursor < len(tokens) and not self.done:
            left_in_split = self.capacity[self.split] - self.written(self.split) - self.filled
            room = int(min(self.shard_tokens - self.filled, left_in_split))
            take = min(room, len(tokens) - cursor)
            if self.buffer is None:
                self.buffer = np.empty(int(min(self.shard_tokens, left_in_split)), dtype=np.uint16)
            self.buffer[self.filled : self.filled + take] = tokens[cursor : cursor + take]
            self.filled += take
            cursor += take
            taken += take
            if take < room:  # the batch ran out before the shard filled
                break
            if self.split == "val" and take == left_in_split:
                # val is full: drop the rest of the current document, train starts at the next one
                cursor = int(doc_ends[np.searchsorted(doc_ends, cursor, side="left")])
                self.finish(_position_after(cursor, doc_ends, first_doc))
                self.split = "train"
            else:
                self.finish(_position_after(cursor, doc_ends, first_doc))
        return taken

    def finish(self, end: tuple[int, int]) -> None:
        """Write the current shard; ``end`` = (document, token offset) where the next shard starts."""
        if self.filled == 0:
            return
        data = self.buffer[: self.filled]
        name = f"{self.split}_{len(self.records(self.split)):06d}.bin"
        tmp = self.directory / f".{name}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(memoryview(data))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.directory / name)
        self.progress["shards"].append(
            {
                "split": self.split,
                "file": name,
                "tokens": int(self.filled),
                "sha256": hashlib.sha256(memoryview(data)).hexdigest(),
                "max_token": int(data.max()),
                "end": [int(end[0]), int(end[1])],
            }
        )
        write_json_atomic(self.directory / PROGRESS, self.progress)
        self.buffer = None
        self.filled = 0


def _verified_records(directory: Path, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The longest prefix of recorded shards whose files are present and intact."""
    kept = []
    for r in records:
        path = directory / r["file"]
        if not path.is_file() or path.stat().st_size != 2 * r["tokens"] or sha256_file(path) != r["sha256"]:
            log.warning("%s is missing or changed since it was written; preparing again from there", path)
            break
        kept.append(r)
    return kept


def _position_after(cursor: int, doc_ends: np.ndarray, first_doc: int) -> tuple[int, int]:
    """(document index, offset) of token ``cursor`` of a batch whose documents end at ``doc_ends``."""
    k = int(np.searchsorted(doc_ends, cursor, side="right"))
    start = int(doc_ends[k - 1]) if k > 0 else 0
    return first_doc + k, cursor - start


def write_shards(
    source,
    directory: Path,
    config: dict[str, Any],
    *,
    val_tokens: int,
    shard_tokens: int,
    token_budget: int | None = None,
    workers: int = 2,
    progress_bar: bool = True,
) -> dict[str, Any]:
    """Tokenize ``source`` into ``directory`` (resuming a previous run there) and write the manifest.

    Returns the manifest. ``config`` is recorded in progress.json and the manifest; a partial run
    recorded with a different config raises ManifestError.
    """
    from tqdm import tqdm

    if shard_tokens < 1 or val_tokens < 0 or (token_budget is not None and token_budget < 1):
        raise SourceError(
            f"data.shard_tokens={shard_tokens} must be >= 1, data.val_tokens={val_tokens} >= 0 "
            f"and data.token_budget={token_budget} null or >= 1"
        )
    directory.mkdir(parents=True, exist_ok=True)
    for p in directory.iterdir():  # temporary files of an interrupted run are never finished shards
        if TMP_RE.match(p.name):
            p.unlink()

    progress: dict[str, Any] = {"format_version": FORMAT_VERSION, "config": config, "shards": []}
    progress_path = directory / PROGRESS
    if progress_path.is_file():
        previous = read_json(progress_path)
        diffs = config_differences(previous.get("config", {}), config, IDENTITY_KEYS + SIZE_KEYS)
        if diffs:
            raise ManifestError(
                f"{progress_path}: {directory} holds an unfinished preparation with other settings "
                f"({'; '.join(diffs)}). Delete {directory} or choose another data.dir."
            )
        progress["shards"] = _verified_records(directory, previous.get("shards", []))
    writer = ShardWriter(directory, progress, val_tokens, shard_tokens, token_budget)
    doc, offset = progress["shards"][-1]["end"] if progress["shards"] else (0, 0)
    if progress["shards"]:
        log.info(
            "resuming %s after %d finished shards (document %d)", directory, len(progress["shards"]), doc
        )

    done = sum(r["tokens"] for r in progress["shards"])
    started = time.perf_counter()
    batches = iter(()) if writer.done else source.batches(doc)  # opens the source: fails before any output
    bar = tqdm(
        total=None if token_budget is None else val_tokens + token_budget,
        initial=done,
        unit="tok",
        unit_scale=True,
        desc=f"tokenizing {directory.name}",
        disable=not progress_bar,
        mininterval=1.0,
    )
    for tokens, lengths in tokenize_batches(batches, workers):
        bar.update(
            writer.feed(tokens, lengths, doc, start=offset)
        )  # only a resumed first batch has offset > 0
        doc, offset = doc + len(lengths), 0
        if writer.done:
            break
    writer.finish((doc, 0))  # the last, shorter shard (nothing when the budget ended on a full one)
    bar.close()
    elapsed = time.perf_counter() - started

    records = progress["shards"]
    if not any(r["split"] == "train" for r in records):
        total = sum(r["tokens"] for r in records)
        raise SourceError(
            f"{config.get('name')}: the source holds {total:,} tokens, all taken by the validation split "
            f"(data.val_tokens={val_tokens:,}); lower data.val_tokens or add data"
        )
    last_end = records[-1]["end"]
    manifest = {
        "format_version": FORMAT_VERSION,
        "tokenizer": "gpt2",
        "vocab_size": VOCAB_SIZE,
        "eot_id": EOT_ID,
        "dtype": DTYPE,
        "config": config,
        "source": source.describe(),
        "documents": int(last_end[0]) + (1 if last_end[1] else 0),
        "splits": {
            s: {
                "tokens": sum(r["tokens"] for r in records if r["split"] == s),
                "shards": [
                    {k: r[k] for k in ("file", "tokens", "sha256", "max_token")}
                    for r in records
                    if r["split"] == s
                ],
            }
            for s in SPLITS
        },
    }
    write_json_atomic(directory / MANIFEST, manifest)
    new_tokens = manifest["splits"]["train"]["tokens"] + manifest["splits"]["val"]["tokens"] - done
    print(
        f"{summary(directory, manifest)}; {new_tokens:,} tokens tokenized in {elapsed:.1f} s "
        f"({new_tokens / max(elapsed, 1e-9):,.0f} tokens/s)",
        flush=True,
    )
    return manifest


def summary(directory: Path, manifest: dict[str, Any]) -> str:
    """One line of token counts: what prepare prints at the end."""
    splits = manifest["splits"]
    return (
        f"{directory}: train {splits['train']['tokens']:,} tokens "
        f"in {len(splits['train']['shards'])} shard(s), "
        f"val {splits['val']['tokens']:,} tokens in {len(splits['val']['shards'])} shard(s), "
        f"{manifest['documents']:,} documents"
    )
