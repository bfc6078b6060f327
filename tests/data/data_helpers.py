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


SPLIT_SEED = DataConfig().split_seed  # the default sample rule of every source but the embedded corpus
_MASK = (1 << 64) - 1


def splitmix64(seed: int, i: int) -> int:
    """Output i (from 0) of the SplitMix64 generator seeded with ``seed``, in plain Python: the reference
    of the sample rule's document keys."""
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def expected_splits(
    docs: list[str],
    val_tokens: int,
    token_budget: int | None = None,
    split_seed: int | None = None,
    scanned: int | None = None,
):
    """(val, train) token arrays a preparation of the stream ``docs`` must produce.

    ``split_seed`` None: the head rule (the first val_tokens tokens). Otherwise the sample rule: the
    non-blank documents of smallest splitmix64 key among the first ``scanned`` (default all), taken in
    key order up to val_tokens tokens, in stream order with the last one taken cut and placed last;
    training is every other document in stream order.
    """
    if split_seed is None or val_tokens == 0:
        stream, ends = token_stream(docs)
        val = stream[:val_tokens]
        train_start = int(ends[np.searchsorted(ends, val_tokens, side="left")]) if val_tokens else 0
        train = stream[train_start:]
    else:
        ids = get_tokenizer().encode_ordinary_batch(docs, num_threads=1)
        parts = [
            np.array(d + [EOT_ID] if t.strip() else [], dtype=np.uint16)
            for t, d in zip(docs, ids, strict=True)
        ]
        n = len(docs) if scanned is None else scanned
        taken, total = [], 0
        for i in sorted((i for i in range(n) if len(parts[i])), key=lambda i: splitmix64(split_seed, i)):
            taken.append(i)
            total += len(parts[i])
            if total >= val_tokens:
                break
        *whole, cut = taken
        head = [parts[i] for i in sorted(whole)]
        val = np.concatenate([*head, parts[cut][: val_tokens - sum(map(len, head))]])
        train = np.concatenate([parts[i] for i in range(len(docs)) if i not in taken])
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


def compose_data(overrides: list[str]) -> DataConfig:
    """The DataConfig the prepare command composes from ``overrides`` (its command-line arguments)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from mars.data.cli import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="prepare", overrides=overrides)
    return OmegaConf.to_object(cfg.data)


def run_prepare(cfg: DataConfig, resplit: bool = False) -> None:
    """The prepare script's task in-process, on ``cfg`` (errors: one stderr line and SystemExit(1))."""
    from omegaconf import OmegaConf

    from mars.data.cli import PrepareConfig, run

    run(OmegaConf.structured(PrepareConfig(data=cfg, resplit=resplit)))


def local_cfg(root: Path, paths: list, **kw) -> DataConfig:
    kw.setdefault("num_workers", 1)
    kw.setdefault("val_tokens", 300)
    return DataConfig(name="local", root=str(root), paths=[str(p) for p in paths], **kw)


class Interrupt(Exception):
    pass


def interrupt_after(monkeypatch, n_shards: int):
    """Make the run die while writing shard number ``n_shards`` (0-based), leaving a partial temp file."""
    from mars.data import writer as writer_mod

    real_finish = writer_mod.ShardWriter.finish
    calls = {"n": 0}

    def finish(self, end):
        if self.filled and calls["n"] == n_shards:
            tmp = self.directory / f".{self.split}_{self.count[self.split]:06d}.bin.tmp-999"
            tmp.write_bytes(b"\x01\x02" * 10)  # a half-written shard
            raise Interrupt
        if self.filled:
            calls["n"] += 1
        return real_finish(self, end)

    monkeypatch.setattr(writer_mod.ShardWriter, "finish", finish)
