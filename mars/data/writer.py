"""Tokenize a stream of documents into token shards, resumably, and write the manifest.

The tokenizer is data.tokenizer (recorded in the config as "tokenizer" when it is not GPT-2's); the
shards are uint16, or uint32 for a vocabulary above 65536 tokens. Every document is followed by the
tokenizer's end-of-text token (GPT-2's <|endoftext|>). The validation split is drawn by the rule of
mars.data.split: a seeded sample of documents (a first pass over the stream, then the training split
from the stream with those documents blanked), or the head of the stream. The last validation
document is cut at val_tokens and its remainder dropped, so no document is in both splits. Shards are
written under a temporary name, fsync'ed and renamed, and recorded in progress.json (with the stream
position where the next shard starts) only after the rename; the manifest comes last.

One mechanism keeps the shards right, whether a run was interrupted or a finished shard was damaged
later: check every recorded shard (integrity.check_shard_file: size, and sha256 unless the
``.verified.json`` cache vouches for the file), re-read the document stream from where the first bad
one starts, regenerate from there, and write a regenerated shard only over a bad one, after checking
it has the recorded sha256 -- if it has not, the source changed, and SourceChangedError stops the run
instead of putting different data under the old record. ``write_shards`` then carries on past the
last recorded shard (resuming an interrupted preparation); ``repair_shards`` (the prepare command on
a finished directory) stops after the last bad one.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from mars.data.integrity import ShardCheck, VerifiedCache, check_shard_file
from mars.data.layout import (
    DTYPE,
    FORMAT_VERSION,
    MANIFEST,
    PROGRESS,
    SIZE_KEYS,
    SPLIT_KEYS,
    SPLITS,
    TMP_RE,
    config_differences,
    identity_keys,
    read_json,
    write_json,
)
from mars.data.sources import SKIP_EXAMPLES, SkipLog, Source
from mars.data.split import SAMPLE, HeldOut, sample_val, split_record
from mars.data.tokenizer import GPT2, encode_batch, tokenizer_info
from mars.errors import DataError, ManifestError, SourceChangedError
from mars.files import write_atomic

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- tokenization


def tokenizer_of(config: dict[str, Any]) -> str:
    """The data.tokenizer a requested config (mars.data.layout.requested_config) records: gpt2 if none."""
    return str(config.get("tokenizer") or GPT2)


def encode_documents(texts: list[str], tokenizer: str = GPT2) -> tuple[np.ndarray, np.ndarray]:
    """Tokens of ``texts``, each followed by the end-of-text token, as one array of the tokenizer's shard
    dtype, plus each document's length.

    Blank documents (e.g. empty lines of a text file read by line) contribute nothing, not even an EOT.
    """
    info = tokenizer_info(tokenizer)
    ids = encode_batch(texts, tokenizer)
    lengths = np.fromiter(
        (len(d) + 1 if t.strip() else 0 for t, d in zip(texts, ids, strict=True)), np.int64, len(ids)
    )
    out = np.empty(int(lengths.sum()), dtype=np.dtype(info.dtype))
    pos = 0
    for doc, length in zip(ids, lengths, strict=True):
        if length:
            out[pos : pos + length - 1] = doc
            out[pos + length - 1] = info.eot_id
            pos += length
    return out, lengths


def _init_worker(tokenizer: str) -> None:
    encode_batch(["warm up"], tokenizer)


@contextmanager
def _spawn_default() -> Iterator[None]:
    """Make "spawn" the process-wide start method while the pool starts its workers. A spawned child
    first sets the parent's default start method, and inside a joblib worker (Hydra's parallel
    launcher: a sweep whose first job prepares the embedded corpus) that is "loky", which a fresh
    child does not know: every worker would die at start and the pool would replace it forever."""
    method = mp.get_start_method(allow_none=True)
    if method in (None, "spawn", "fork", "forkserver"):
        yield
        return
    mp.set_start_method("spawn", force=True)
    try:
        yield
    finally:
        mp.set_start_method(method, force=True)


class TokenizerPool:
    """``encode_documents`` over batches of documents in ``workers`` processes, results in input order:
    ``pool(batches)`` iterates (tokens, lengths) per batch. The processes start on first use and serve
    every later call until ``close`` (a sampled validation split reads the stream twice).

    At most ``2 * workers + 2`` batches are in flight, so memory stays bounded on any dataset size.
    """

    def __init__(self, workers: int, tokenizer: str = GPT2):
        self.workers = workers
        self.tokenizer = tokenizer
        self.stack = ExitStack()
        self.pool = None

    def __enter__(self) -> TokenizerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.stack.close()
        self.pool = None

    def __call__(self, batches: Iterator[list[str]]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if self.workers <= 1:
            for texts in batches:
                yield encode_documents(texts, self.tokenizer)
            return
        if self.pool is None:
            # spawn, not fork: the parent may hold threads (datasets' streaming, torch) that fork would
            # copy mid-lock.
            self.stack.enter_context(_spawn_default())
            self.pool = self.stack.enter_context(
                mp.get_context("spawn").Pool(
                    self.workers, initializer=_init_worker, initargs=(self.tokenizer,)
                )
            )
        pending: deque = deque()
        for texts in batches:
            pending.append(self.pool.apply_async(encode_documents, (texts, self.tokenizer)))
            if len(pending) >= 2 * self.workers + 2:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ----------------------------------------------------------------------------- shard writing


class SkipLedger:
    """Counts the bad documents the source skipped before each shard's end, and keeps the first few.

    The source runs ahead of the writer (batches are in flight in the tokenizer pool), so a skipped
    document is counted only once a finished shard ends after it. Each shard record then holds the
    count of skipped documents before its end, and a run restarted from that end -- which reads the
    stream again from there -- counts every skipped document exactly once.
    """

    def __init__(self, skips: SkipLog | None, count: int = 0, examples: list[dict[str, Any]] | None = None):
        self.skips = skips if skips is not None else SkipLog()
        self.count = count
        self.examples = list(examples or [])
        self.seen = 0  # entries of skips.first already considered

    def advance(self, document: int) -> int:
        """Count the skips before ``document`` (the end of a finished shard); returns the total so far."""
        self.count += self.skips.take_before(document)
        first = self.skips.first
        while self.seen < len(first) and first[self.seen].index < document:
            bad = first[self.seen]
            self.seen += 1
            if len(self.examples) < SKIP_EXAMPLES:
                self.examples.append({"document": bad.index, "where": bad.where, "problem": bad.problem})
        return self.count


class ShardWriter:
    """Routes the token stream into shards and writes each finished shard atomically.

    The first ``val_tokens`` tokens go to the val split (the document they end in is cut there and
    its remainder dropped), everything after to train, ``shard_tokens`` per shard, up to
    ``token_budget`` train tokens. (A sampled validation split is ``put`` whole first; the training
    stream then comes with ``val_tokens=0``.) Every new shard is recorded in progress.json together with the
    stream position (document, token offset) where the next shard starts.

    Regenerating: ``start`` recorded shards come before the stream position the writer starts at.
    A shard it finishes that progress.json already records must have the recorded bytes
    (else SourceChangedError naming ``hint``, what to do); it is written only when its index is in
    ``rewrite`` (the recorded file is missing or damaged: ``rewrite`` maps it to the reason). With
    ``stop_after``, the writer is complete once that recorded shard is regenerated.
    """

    def __init__(
        self,
        directory: Path,
        progress: dict[str, Any],
        val_tokens: int,
        shard_tokens: int,
        token_budget: int | None,
        *,
        start: int | None = None,
        rewrite: dict[int, str] | None = None,
        stop_after: int | None = None,
        ledger: SkipLedger | None = None,
        hint: str = "",
        report: Callable[[str], None] = print,
        rebuilt: list[str] | None = None,
    ):
        self.directory = directory
        self.progress = progress
        self.records: list[dict[str, Any]] = progress["shards"]
        self.next = len(self.records) if start is None else start  # index of the shard being filled
        self.tokens = {
            s: sum(r["tokens"] for r in self.records[: self.next] if r["split"] == s) for s in SPLITS
        }
        self.count = {s: sum(r["split"] == s for r in self.records[: self.next]) for s in SPLITS}
        self.shard_tokens = shard_tokens
        self.capacity = {"val": val_tokens, "train": float("inf") if token_budget is None else token_budget}
        self.split = "val" if self.tokens["val"] < val_tokens else "train"
        self.rewrite = dict(rewrite or {})
        self.stop_after = stop_after
        self.ledger = ledger or SkipLedger(None)
        self.hint = hint
        self.report = report
        self.rebuilt = [] if rebuilt is None else rebuilt  # names of the recorded shards rewritten
        self.buffer: np.ndarray | None = None
        self.filled = 0

    @property
    def done(self) -> bool:
        """True once the token budget is reached: nothing more will be written."""
        return self.split == "train" and self.tokens["train"] >= self.capacity["train"]

    @property
    def complete(self) -> bool:
        """True once the last shard asked for (``stop_after``) is regenerated."""
        return self.stop_after is not None and self.next > self.stop_after

    def feed(self, tokens: np.ndarray, lengths: np.ndarray, first_doc: int, start: int = 0) -> int:
        """Take ``tokens[start:]``: documents ``first_doc, first_doc + 1, ...`` of ``lengths`` tokens each.

        Returns how many tokens were written (or buffered).
        """
        doc_ends = np.cumsum(lengths)
        cursor, taken = start, 0
        while cursor < len(tokens) and not self.done and not self.complete:
            left_in_split = self.capacity[self.split] - self.tokens[self.split] - self.filled
            room = int(min(self.shard_tokens - self.filled, left_in_split))
            take = min(room, len(tokens) - cursor)
            if self.buffer is None:
                self.buffer = np.empty(int(min(self.shard_tokens, left_in_split)), dtype=tokens.dtype)
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
        """Complete the current shard; ``end`` = (document, token offset) where the next shard starts."""
        if self.filled == 0:
            return
        data = self.buffer[: self.filled]
        split, tokens = self.split, int(self.filled)
        name = f"{split}_{self.count[split]:06d}.bin"
        digest = hashlib.sha256(memoryview(data)).hexdigest()
        skipped = self.ledger.advance(int(end[0]))
        if self.next < len(self.records):  # regenerated: it must be the recorded shard
            expected = self.records[self.next]
            if (expected["file"], expected["tokens"], expected["sha256"]) != (name, tokens, digest):
                raise SourceChangedError(
                    f"{self.directory / expected['file']} cannot be rebuilt: the source now gives other "
                    f"tokens for it ({_difference(expected, name, tokens, digest)}), so the source "
                    f"documents changed since it was prepared; {self.hint}"
                )
            if self.next in self.rewrite:
                write_atomic(self.directory / name, memoryview(data), fsync=True)  # whole or absent
                self.rebuilt.append(name)
                self.report(f"repaired {self.directory / name} ({self.rewrite[self.next]})")
        else:
            write_atomic(self.directory / name, memoryview(data), fsync=True)  # whole or absent
            self.records.append(
                {
                    "split": split,
                    "file": name,
                    "tokens": tokens,
                    "sha256": digest,
                    "max_token": int(data.max()),
                    "end": [int(end[0]), int(end[1])],
                    "skipped": skipped,
                }
            )
            self.progress["skipped_examples"] = self.ledger.examples
            write_json(self.directory / PROGRESS, self.progress)
        self.next += 1
        self.tokens[split] += tokens
        self.count[split] += 1
        self.buffer = None
        self.filled = 0

    def put(self, tokens: np.ndarray) -> None:
        """Write ``tokens``, a whole split drawn before the stream is read (the sample rule's validation
        split), as shards of the current split, each recorded as ending at the start of the stream."""
        for i in range(0, len(tokens), self.shard_tokens):
            self.buffer = tokens[i : i + self.shard_tokens]
            self.filled = len(self.buffer)
            self.finish((0, 0))


def _difference(expected: dict[str, Any], name: str, tokens: int, digest: str) -> str:
    if expected["file"] != name:
        return f"the stream now gives {name} at its place"
    if expected["tokens"] != tokens:
        return f"{tokens} tokens instead of {expected['tokens']}"
    return f"sha256 {digest[:16]}... instead of {expected['sha256'][:16]}..."


def _position_after(cursor: int, doc_ends: np.ndarray, first_doc: int) -> tuple[int, int]:
    """(document index, offset) of token ``cursor`` of a batch whose documents end at ``doc_ends``."""
    k = int(np.searchsorted(doc_ends, cursor, side="right"))
    start = int(doc_ends[k - 1]) if k > 0 else 0
    return first_doc + k, cursor - start


def check_records(
    directory: Path,
    records: list[dict[str, Any]],
    cache: VerifiedCache,
    listed_in: str,
    progress_bar: bool = False,
    dtype: str = DTYPE,
) -> list[ShardCheck]:
    """Check each recorded shard file (size; sha256 unless ``cache`` vouches for it) and save the cache."""
    from tqdm import tqdm

    checks = []
    bar = tqdm(records, desc=f"checking {directory.name}", unit="shard", disable=not progress_bar, delay=1.0)
    try:
        for r in bar:  # hashing a never-verified multi-GB dataset takes a while: show it after a second
            checks.append(
                check_shard_file(
                    directory / r["file"], int(r["tokens"]), r["sha256"], cache, listed_in, dtype=dtype
                )
            )
    finally:
        bar.close()
        cache.save()  # what was verified stays verified, even when interrupted
    return checks


def _regenerate(
    source: Source,
    writer: ShardWriter,
    *,
    tokenize: TokenizerPool,
    progress_bar: bool,
    total: int | None,
    desc: str,
) -> None:
    """Stream ``source`` from where ``writer`` starts into it, until the stream ends or the writer is done."""
    from tqdm import tqdm

    records = writer.records
    doc, offset = records[writer.next - 1]["end"] if writer.next else (0, 0)
    # opens the source now: a bad name, file or network fails before any output
    batches = iter(()) if writer.done or writer.complete else source.batches(doc)
    bar = tqdm(
        total=total,
        initial=writer.tokens["val"] + writer.tokens["train"],
        unit="tok",
        unit_scale=True,
        desc=desc,
        disable=not progress_bar,
        mininterval=1.0,
        delay=1.0,  # a run that ends (or fails) within a second leaves no bar behind
    )
    writer.report = bar.write if progress_bar else writer.report
    try:
        for tokens, lengths in tokenize(batches):
            # only the first batch of a restarted stream begins mid-document (offset > 0)
            bar.update(writer.feed(tokens, lengths, doc, start=offset))
            doc, offset = doc + len(lengths), 0
            if writer.done or writer.complete:
                break
        if not writer.complete:
            writer.finish((doc, 0))  # the last, shorter shard (nothing when the budget ended on a full one)
    except BaseException:
        bar.leave = False  # the error, not a half-finished bar, is the last thing on the terminal
        raise
    finally:
        bar.close()
    wanted = len(records) if writer.stop_after is None else writer.stop_after + 1
    if writer.next < wanted:
        missing = records[writer.next]["file"]
        raise SourceChangedError(
            f"{writer.directory / missing} cannot be rebuilt: the source now ends before it, so the "
            f"source documents changed since it was prepared; {writer.hint}"
        )


def _restart_point(checks: list[ShardCheck]) -> tuple[int, dict[int, str]]:
    """(index of the first bad shard or len(checks), {index: reason} of every bad shard)."""
    bad = {i: c.short for i, c in enumerate(checks) if not c.ok}
    return (min(bad) if bad else len(checks)), bad


def _ledger(source: Source, progress: dict[str, Any], start: int) -> SkipLedger:
    """The skip count and examples as they stood at the end of recorded shard ``start - 1``."""
    records = progress["shards"]
    count = int(records[start - 1].get("skipped", 0)) if start else 0
    before = int(records[start - 1]["end"][0]) if start else 0
    examples = [e for e in progress.get("skipped_examples", []) if e.get("document", 0) < before]
    return SkipLedger(getattr(source, "skipped", None), count, examples)


def _write_sampled_val(
    source: Source,
    directory: Path,
    progress: dict[str, Any],
    rewrite: dict[int, str],
    rebuilt: list[str],
    *,
    val_tokens: int,
    shard_tokens: int,
    token_budget: int | None,
    tokenize: TokenizerPool,
    progress_bar: bool,
    hint: str,
) -> None:
    """Draw the sample rule's validation split from ``source`` (mars.data.split.sample_val: the first of
    the two passes over the stream) and write its shards: the missing ones, and the recorded ones that
    ``rewrite`` names, once they prove to have the recorded bytes (their names are added to ``rebuilt``).

    A split recorded in ``progress`` (an interrupted run, a repair) must be drawn again exactly: the
    same documents read, the same largest key taken, else the source changed (SourceChangedError).
    """
    from tqdm import tqdm

    config = progress["config"]
    recorded = progress["val_split"] if "last_key" in progress["val_split"] else None  # drawn before
    window = recorded.get("window") if recorded else getattr(source, "split_window", None)
    bar = tqdm(
        unit="doc",
        unit_scale=True,
        desc=f"sampling the validation split of {directory.name}",
        disable=not progress_bar,
        mininterval=1.0,
        delay=1.0,
    )
    try:
        val, record = sample_val(
            source.batches(0),
            int(progress["val_split"]["seed"]),
            val_tokens,
            tokenize,
            window=window,
            token_budget=token_budget,
            name=str(config.get("name")),
            progress=bar.update,
        )
    finally:
        bar.close()
    skips = getattr(source, "skipped", None)
    if isinstance(skips, SkipLog):
        skips.clear()  # the second pass, which writes the training split, counts them
    if recorded is not None and recorded != record:
        changed = ", ".join(
            f"{k} {record[k]} instead of {recorded.get(k)}" for k in record if record[k] != recorded.get(k)
        )
        raise SourceChangedError(
            f"{directory}: its validation split cannot be drawn again ({changed}): the source documents "
            f"changed since it was prepared; {hint}"
        )
    progress["val_split"] = record
    writer = ShardWriter(
        directory,
        progress,
        val_tokens,
        shard_tokens,
        None,
        start=0,
        rewrite=rewrite,
        hint=hint,
        rebuilt=rebuilt,
    )
    writer.put(val)


def _rewrite(
    source: Source,
    directory: Path,
    progress: dict[str, Any],
    bad: dict[int, str],
    rebuilt: list[str],
    *,
    repair: bool,
    val_tokens: int,
    shard_tokens: int,
    token_budget: int | None,
    workers: int,
    progress_bar: bool,
    hint: str,
    total: int | None,
    desc: str,
) -> None:
    """Regenerate the recorded shards that ``bad`` names (index -> why) and, unless ``repair``, write the
    ones after the last recorded shard; the names rewritten are added to ``rebuilt``.

    The head rule's splits are one stream, regenerated from where the first bad shard starts. The sample
    rule's validation split is drawn first (when one of its shards is bad, or when it is not all
    recorded yet), then the training split is regenerated from where its first bad shard starts, in the
    stream with the validation documents blanked (mars.data.split.HeldOut). Both passes share one pool
    of tokenizer processes.
    """
    records = progress["shards"]
    sampled = progress["val_split"]["rule"] == SAMPLE and val_tokens > 0
    with TokenizerPool(workers, tokenizer_of(progress["config"])) as tokenize:
        if sampled:
            # the validation shards lead the records: they are written before the training split
            val = [i for i, r in enumerate(records) if r["split"] == "val"]
            bad_val = {i: why for i, why in bad.items() if i in val}
            drawn = "last_key" in progress["val_split"]
            unfinished = not drawn or sum(records[i]["tokens"] for i in val) < val_tokens
            if bad_val or (unfinished and not repair):
                _write_sampled_val(
                    source,
                    directory,
                    progress,
                    bad_val,
                    rebuilt,
                    val_tokens=val_tokens,
                    shard_tokens=shard_tokens,
                    token_budget=token_budget,
                    tokenize=tokenize,
                    progress_bar=progress_bar,
                    hint=hint,
                )
            bad = {i: why for i, why in bad.items() if i not in val}
        if repair and not bad:
            return
        start = min(bad, default=len(records))
        writer = ShardWriter(
            directory,
            progress,
            0 if sampled else val_tokens,
            shard_tokens,
            token_budget,
            start=start,
            rewrite=bad,
            stop_after=max(bad) if repair else None,
            ledger=_ledger(source, progress, start),
            hint=hint,
            rebuilt=rebuilt,
        )
        _regenerate(
            HeldOut(source, progress["val_split"]) if sampled else source,
            writer,
            tokenize=tokenize,
            progress_bar=progress_bar,
            total=total,
            desc=desc,
        )


def write_shards(
    source: Source,
    directory: Path,
    config: dict[str, Any],
    *,
    val_tokens: int,
    shard_tokens: int,
    token_budget: int | None = None,
    workers: int = 2,
    progress_bar: bool = True,
    hint: str | None = None,
) -> dict[str, Any]:
    """Tokenize ``source`` into ``directory`` (resuming a previous run there) and write the manifest.

    Returns the manifest. ``config`` is recorded in progress.json and the manifest; a partial run
    recorded with a different config raises ManifestError. ``hint`` says what to do when a recorded
    shard cannot be regenerated because the source changed (SourceChangedError).
    """
    if shard_tokens < 1 or val_tokens < 0 or (token_budget is not None and token_budget < 1):
        raise DataError(
            f"data.shard_tokens={shard_tokens} must be >= 1, data.val_tokens={val_tokens} >= 0 "
            f"and data.token_budget={token_budget} null or >= 1"
        )
    hint = hint or f"restore the source as it was, or delete {directory} and prepare it again"
    directory.mkdir(parents=True, exist_ok=True)
    for p in directory.iterdir():  # temporary files of an interrupted run are never finished shards
        if TMP_RE.match(p.name):
            p.unlink()

    progress: dict[str, Any] = {"format_version": FORMAT_VERSION, "config": config, "shards": []}
    progress_path = directory / PROGRESS
    cache = VerifiedCache(directory)
    if progress_path.is_file():
        previous = read_json(progress_path)
        keys = identity_keys(config) + SIZE_KEYS + SPLIT_KEYS
        diffs = config_differences(previous.get("config", {}), config, keys)
        if diffs:
            raise ManifestError(
                f"{progress_path}: {directory} holds an unfinished preparation with other settings "
                f"({'; '.join(diffs)}). Delete {directory} or choose another data.dir."
            )
        progress["shards"] = previous.get("shards", [])
        progress["skipped_examples"] = previous.get("skipped_examples", [])
        if "val_split" in previous:
            progress["val_split"] = previous["val_split"]
    records = progress["shards"]
    info = tokenizer_info(tokenizer_of(config))
    checks = check_records(directory, records, cache, PROGRESS, progress_bar, dtype=info.dtype)
    start, bad = _restart_point(checks)
    if start:
        log.info(
            "resuming %s after %d finished shards (document %d)",
            directory,
            start,
            records[start - 1]["end"][0],
        )
    before = sum(r["tokens"] for r in records[:start])
    started = time.perf_counter()
    rebuilt: list[str] = []
    progress.setdefault("val_split", split_record(config))
    _rewrite(
        source,
        directory,
        progress,
        bad,
        rebuilt,
        repair=False,
        val_tokens=val_tokens,
        shard_tokens=shard_tokens,
        token_budget=token_budget,
        workers=workers,
        progress_bar=progress_bar,
        hint=hint,
        total=None if token_budget is None else val_tokens + token_budget,
        desc=f"tokenizing {directory.name}",
    )
    for name in rebuilt:
        cache.forget(name)
    cache.save()
    elapsed = time.perf_counter() - started

    if not any(r["split"] == "train" for r in records):
        total = sum(r["tokens"] for r in records)
        raise DataError(
            f"{config.get('name')}: the source holds {total:,} tokens, all taken by the validation split "
            f"(data.val_tokens={val_tokens:,}); lower data.val_tokens or add data"
        )
    last_end = records[-1]["end"]
    manifest = {
        "format_version": FORMAT_VERSION,
        "tokenizer": info.name,
        "tokenizer_sha256": info.sha256,
        "vocab_size": info.vocab_size,
        "eot_id": info.eot_id,
        "dtype": info.dtype,
        "config": config,
        "source": source.describe(),
        "documents": int(last_end[0]) + (1 if last_end[1] else 0),
        "skipped_documents": int(records[-1].get("skipped", 0)),
        "skipped_examples": [f"{e['where']}: {e['problem']}" for e in progress.get("skipped_examples", [])],
        "val_split": progress["val_split"],
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
    write_json(directory / MANIFEST, manifest)
    new_tokens = manifest["splits"]["train"]["tokens"] + manifest["splits"]["val"]["tokens"] - before
    print(
        f"{summary(directory, manifest)}; {new_tokens:,} tokens tokenized in {elapsed:.1f} s "
        f"({new_tokens / max(elapsed, 1e-9):,.0f} tokens/s)",
        flush=True,
    )
    if manifest["skipped_documents"]:
        print(skipped_line(directory, manifest), flush=True)
    return manifest


def repair_shards(
    make_source: Callable[[], Source],
    directory: Path,
    *,
    val_tokens: int,
    shard_tokens: int,
    token_budget: int | None = None,
    workers: int = 2,
    progress_bar: bool = True,
    hint: str | None = None,
) -> list[str]:
    """Check a finished preparation's shards and rebuild the missing or damaged ones; returns their names.

    Intact shards cost a ``stat`` when ``.verified.json`` vouches for them, else one hash (which is
    then remembered). A bad shard is regenerated from the source, starting at the stream position
    progress.json records for it (a shard of a sampled validation split: by drawing the sample again),
    and written only when it has the sha256 the manifest records; otherwise SourceChangedError says
    so, naming the shard and ``hint``. ``make_source`` is only called when something needs rebuilding.
    """
    manifest = read_json(directory / MANIFEST)
    entries = [e for s in SPLITS for e in manifest.get("splits", {}).get(s, {}).get("shards", [])]
    cache = VerifiedCache(directory)
    dtype = str(manifest.get("dtype", DTYPE))
    checks = check_records(directory, entries, cache, "the manifest", progress_bar, dtype=dtype)
    damaged = [(e, c) for e, c in zip(entries, checks, strict=True) if not c.ok]
    if not damaged:
        return []
    hint = hint or f"restore the source as it was, or delete {directory} and prepare it again"
    first = damaged[0][0]["file"]
    progress_path = directory / PROGRESS
    if not progress_path.is_file():
        raise ManifestError(
            f"{directory / first} needs rebuilding but {progress_path} (where each shard starts in the "
            f"document stream) is missing; {hint}"
        )
    progress = read_json(progress_path)
    records = progress.get("shards", [])
    position = {r.get("file"): i for i, r in enumerate(records)}
    for entry in entries:
        i = position.get(entry["file"])
        if i is None or (records[i]["tokens"], records[i]["sha256"]) != (entry["tokens"], entry["sha256"]):
            raise ManifestError(
                f"{progress_path} does not record {entry['file']} as {directory / MANIFEST} does, so "
                f"{directory / first} cannot be rebuilt; {hint}"
            )
    rewrite = {position[e["file"]]: c.short for e, c in damaged}
    rebuilt: list[str] = []
    progress.setdefault("val_split", split_record(progress.get("config", {})))  # older: the head rule
    try:
        _rewrite(
            make_source(),
            directory,
            progress,
            rewrite,
            rebuilt,
            repair=True,
            val_tokens=val_tokens,
            shard_tokens=shard_tokens,
            token_budget=token_budget,
            workers=workers,
            progress_bar=progress_bar,
            hint=hint,
            total=sum(r["tokens"] for r in records[: max(rewrite) + 1]),
            desc=f"repairing {directory.name}",
        )
    finally:
        for name in rebuilt:
            cache.forget(name)
        cache.save()
    return rebuilt


def summary(directory: Path, manifest: dict[str, Any]) -> str:
    """One line of token counts: what prepare prints at the end."""
    splits = manifest["splits"]
    skipped = manifest.get("skipped_documents") or 0
    return (
        f"{directory}: train {splits['train']['tokens']:,} tokens "
        f"in {len(splits['train']['shards'])} shard(s), "
        f"val {splits['val']['tokens']:,} tokens in {len(splits['val']['shards'])} shard(s), "
        f"{manifest['documents']:,} documents" + (f", {skipped:,} bad ones skipped" if skipped else "")
    )


def skipped_line(directory: Path, manifest: dict[str, Any], shown: int = 5) -> str:
    """One line: how many bad documents were skipped and where the first ones are."""
    n = manifest.get("skipped_documents") or 0
    examples = manifest.get("skipped_examples") or []
    listing = "; ".join(examples[:shown]) + ("; ..." if n > shown else "")
    return (
        f"skipped {n:,} bad document(s) (data.skip_bad_documents=true), recorded in "
        f"{directory / MANIFEST}: {listing}"
    )
