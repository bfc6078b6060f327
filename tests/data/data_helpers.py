"""Helpers of the data tests: small English corpora and the token streams their preparation must give."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mars.data.config import DataConfig
from mars.data.tokenizer import EOT_ID, get_tokenizer

# Short English documents of varied length (some long enough to straddle shard boundaries).
WORDS = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly hex every jovial "
    "banker near old stone bridges and rivers"
).split()


def make_docs(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        k = int(rng.integers(3, 120))
        docs.append(f"Document {i}. " + " ".join(WORDS[j] for j in rng.integers(0, len(WORDS), size=k)) + ".")
    return docs


def token_stream(docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """All documents' tokens, each followed by EOT, and the end offset of every document."""
    ids = get_tokenizer().encode_ordinary_batch(docs, num_threads=1)
    parts = [np.array(d + [EOT_ID], dtype=np.uint16) for d in ids]
    return np.concatenate(parts), np.cumsum([len(p) for p in parts])


def expected_splits(docs: list[str], val_tokens: int, token_budget: int | None = None):
    """(val, train) token arrays a preparation of ``docs`` must produce."""
    stream, ends = token_stream(docs)
    val = stream[:val_tokens]
    train_start = int(ends[np.searchsorted(ends, val_tokens, side="left")]) if val_tokens else 0
    train = stream[train_start:]
    if token_budget is not None:
        train = train[:token_budget]
    return val, train


def read_split(directory: Path, split: str) -> np.ndarray:
    manifest = json.loads((directory / "manifest.json").read_text())
    shards = manifest["splits"][split]["shards"]
    if not shards:
        return np.zeros(0, dtype=np.uint16)
    return np.concatenate([np.fromfile(directory / s["file"], dtype=np.uint16) for s in shards])


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    with open(path, "w") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": i, field: d}) + "\n")
    return path


def local_cfg(root: Path, paths: list, **kw) -> DataConfig:
    kw.setdefault("num_workers", 1)
    kw.setdefault("val_tokens", 300)
    return DataConfig(name="local", root=str(root), paths=[str(p) for p in paths], **kw)
