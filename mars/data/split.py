"""The validation split: which documents of the stream are held out, and how to find them again.

Two rules; the manifest records which one made a dataset ("val_split"), with what redoing it needs.

``sample`` (``data.split_seed=S``, the default): document ``i`` of the stream gets the key
``splitmix64(S, i)``, the i-th output of the SplitMix64 generator seeded with S: distinct 64-bit
numbers in an order that S chooses. The validation split is the documents with the smallest keys,
taken in key order until they hold ``data.val_tokens`` tokens (the last one is cut there and the rest
of it dropped): a uniform random sample of the documents of the whole stream, written in stream order
with the cut one last. Every other document goes to training, in stream order. Which documents these
are depends on the seed, the documents and their token counts only: not on how the stream is batched,
on the number of tokenizer processes, or on interruptions. A stream whose end is unknown before it is
read (a streamed Hugging Face dataset: ``Source.split_window``) has its first N documents sampled.

``head`` (``data.split_seed=null``): the first ``data.val_tokens`` tokens of the stream, the document
they end in cut there. The rule of datasets prepared before the sample rule existed, and of the
embedded corpus, whose documents are shuffled before they are split (``Source.shuffled``).

Preparing with the sample rule reads the stream twice. ``sample_val`` reads it first and tokenizes
only the documents whose key can still be among the smallest (a pool of about ``val_tokens`` tokens
whose largest key falls as more documents are seen), and returns the validation tokens and the
record; ``HeldOut`` then gives the stream with those documents blanked ("" has no tokens and keeps its
document index), which the shard writer turns into the training split exactly as it does a whole
stream, resumably. The record alone (seed, the largest key taken, how many documents were read)
says which documents are held out, so resuming or repairing a training shard needs no first pass.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from mars.errors import DataError

SAMPLE, HEAD = "sample", "head"

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MASK = (1 << 64) - 1


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a fast, well-mixing bijection of uint64 values."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def split_keys(seed: int, first: int, count: int) -> np.ndarray:
    """The keys of documents ``first .. first + count - 1``: outputs ``first + 1 ...`` of SplitMix64 seeded
    with ``seed`` (distinct for distinct documents: the state steps by an odd constant, the mix is a
    bijection)."""
    steps = np.arange(first + 1, first + count + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return mix64(np.uint64(seed & _MASK) + steps * _GOLDEN)


def split_record(config: dict[str, Any]) -> dict[str, Any]:
    """The record of a split rule before it is drawn: the rule of a requested config (its "split_seed")."""
    seed = config.get("split_seed")
    return {"rule": HEAD} if seed is None else {"rule": SAMPLE, "seed": int(seed)}


class _Pool:
    """Every document seen whose key is below ``limit``, with its tokens: the smallest-key documents that
    hold at least ``val_tokens`` tokens, and those seen since that may still displace them.

    Its state after each document depends on the documents so far only (not on what was sent to the
    tokenizer ahead of time), so everything derived from it is the same for any number of workers.
    """

    def __init__(self, val_tokens: int):
        self.val_tokens = val_tokens
        self.docs: list[tuple[int, int, np.ndarray, int]] = []  # (key, document index, tokens, characters)
        self.tokens = self.chars = 0
        self.limit: int | None = None  # no document with a key at or above it can be taken any more

    def add(self, key: int, index: int, tokens: np.ndarray, chars: int) -> None:
        if len(tokens) and (self.limit is None or key < self.limit):
            self.docs.append((key, index, tokens.copy(), chars))  # a copy: a view keeps its batch alive
            self.tokens += len(tokens)
            self.chars += chars
            if self.tokens > 2 * self.val_tokens:  # amortized: sort once the pool doubled
                self.prune()

    def prune(self) -> None:
        """Keep the fewest smallest-key documents that hold ``val_tokens`` tokens; lower ``limit`` to the
        largest key kept."""
        self.docs.sort(key=lambda d: d[0])
        held = 0
        for n, (key, _, tokens, _) in enumerate(self.docs):
            held += len(tokens)
            if held >= self.val_tokens:
                del self.docs[n + 1 :]
                self.tokens, self.chars, self.limit = held, sum(d[3] for d in self.docs), key
                return

    def split(self) -> tuple[np.ndarray, int, int]:
        """(the validation tokens, the largest key taken, the number of documents taken); None when the
        source holds no more than the validation split (self.tokens says how much)."""
        self.prune()
        if self.tokens < self.val_tokens:
            return None
        *whole, cut = self.docs
        whole.sort(key=lambda d: d[1])
        parts = [d[2] for d in whole]
        parts.append(cut[2][: self.val_tokens - sum(len(t) for t in parts)])
        return np.concatenate(parts), int(cut[0]), len(self.docs)


def sample_val(
    batches: Iterator[list[str]],
    seed: int,
    val_tokens: int,
    tokenize: Callable[[Iterator[list[str]]], Iterator[tuple[np.ndarray, np.ndarray]]],
    *,
    window: int | None = None,
    token_budget: int | None = None,
    name: str = "the source",
    progress: Callable[[int], None] = lambda documents: None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Read the document stream ``batches`` (from document 0) and return the validation split of the
    sample rule with ``seed``, and its record.

    The documents sampled are the whole stream, its first ``window`` documents when given, and with a
    ``token_budget`` those up to the batch in which about ``val_tokens + token_budget`` tokens have been
    read -- what the preparation uses -- estimated from the characters read and the tokens per
    character of the documents in the pool (a uniform sample of them). ``tokenize`` maps an iterator of
    text batches to (tokens, lengths) per batch, in order (the shard writer's tokenizer pool); only
    documents whose key is below the pool's limit are sent to it. Raises DataError when the documents
    read hold fewer than ``val_tokens`` tokens.
    """
    pool = _Pool(val_tokens)
    # per batch sent: (documents, characters, indices / keys / characters of those sent to the tokenizer)
    sent: deque[tuple[int, int, np.ndarray, np.ndarray, list[int]]] = deque()
    read = 0

    def candidates() -> Iterator[list[str]]:
        nonlocal read
        for texts in batches:
            if window is not None:
                texts = texts[: window - read]
            keys = split_keys(seed, read, len(texts))
            chosen = np.arange(len(texts)) if pool.limit is None else np.flatnonzero(keys < pool.limit)
            chars = [len(t) for t in texts]
            sent.append((len(texts), sum(chars), chosen + read, keys[chosen], [chars[j] for j in chosen]))
            read += len(texts)
            yield [texts[j] for j in chosen]
            if window is not None and read >= window:
                return

    scanned = chars = 0
    stream = tokenize(candidates())
    try:
        for tokens, lengths in stream:
            count, batch_chars, indices, keys, sizes = sent.popleft()
            ends = np.cumsum(lengths)
            for index, key, end, length, size in zip(indices, keys, ends, lengths, sizes, strict=True):
                pool.add(int(key), int(index), tokens[end - length : end], size)
            scanned, chars = scanned + count, chars + batch_chars
            progress(count)
            if (
                token_budget is not None
                and pool.chars
                and chars * pool.tokens >= (token_budget + val_tokens) * pool.chars
            ):
                break
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()  # stops reading the source when the budget ends the pass early
    taken = pool.split()
    if taken is None:
        raise DataError(
            f"{name}: the source holds {pool.tokens:,} tokens, all taken by the validation split "
            f"(data.val_tokens={val_tokens:,}); lower data.val_tokens or add data"
        )
    val, last_key, documents = taken
    record = {
        "rule": SAMPLE,
        "seed": int(seed),
        "window": window,
        "scanned": scanned,
        "documents": documents,
        "last_key": f"{last_key:016x}",
    }
    return val, record


class HeldOut:
    """The document stream of ``source`` with the validation documents of ``record`` (a sample rule's, as
    ``sample_val`` returned it) blanked: the training documents, with every document keeping its index."""

    def __init__(self, source, record: dict[str, Any]):
        self.source = source
        self.seed = int(record["seed"])
        self.last_key = np.uint64(int(record["last_key"], 16))
        self.scanned = int(record["scanned"])

    def batches(self, start: int = 0) -> Iterator[list[str]]:
        index = start
        for texts in self.source.batches(start):
            count = min(len(texts), max(0, self.scanned - index))
            held = np.flatnonzero(split_keys(self.seed, index, count) <= self.last_key)
            if len(held):
                texts = list(texts)
                for j in held:
                    texts[j] = ""
            index += len(texts)
            yield texts
