"""Dataset configuration: the `data.*` config keys."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DataConfig:
    # source: embedded | openwebtext | fineweb_edu | local
    name: str = "embedded"
    # prepared shards live in {root}/{dir or name}
    root: str = "data"
    dir: str | None = None
    # Hugging Face sources
    hf_path: str | None = None          # e.g. Skylion007/openwebtext, HuggingFaceFW/fineweb-edu
    hf_config: str | None = None        # e.g. sample-10BT for fineweb_edu
    streaming: bool = False
    token_budget: int | None = None     # stop after this many tokens (streamed sources)
    # local files
    paths: list[str] = field(default_factory=list)  # files or globs
    format: str | None = None           # text | jsonl | parquet (inferred from suffix when None)
    text_field: str = "text"
    # shards and split
    val_tokens: int = 1_000_000
    shard_tokens: int = 100_000_000
    num_workers: int = 2
    seed: int = 1337
    # loader
    sequential: bool = False            # without-replacement windows instead of random ones
