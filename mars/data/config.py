"""Dataset configuration: the `data.*` config keys."""

from __future__ import annotations

from dataclasses import dataclass, field

VERIFY_LEVELS = ("cached", "full")
FORMATS = ("text", "jsonl", "parquet")  # data.format (the local source, mars.data.local)
SAMPLE_BY = ("document", "paragraph", "line")  # data.text_sample_by

GPT2_TOKENIZER = "gpt2"


@dataclass
class DataConfig:
    # source: embedded | openwebtext | fineweb_edu | local | a registered one (mars.data.register_source);
    # any other name given with hf_path is that Hugging Face dataset, prepared into {root}/{name}
    name: str = "embedded"
    # gpt2 (offline, exact), or a Hugging Face tokenizer: a directory holding tokenizer.json /
    # tokenizer_config.json, or a hub name (needs internet). Not gpt2: shards go to {root}/{name}-{tokenizer}
    tokenizer: str = GPT2_TOKENIZER
    # prepared shards live in {root}/{dir or name}; a relative root is taken from the repository root
    # when running from a source checkout, else from the current directory
    root: str = "data"
    dir: str | None = None
    # Hugging Face sources
    hf_path: str | None = None  # e.g. Skylion007/openwebtext, HuggingFaceFW/fineweb-edu
    hf_config: str | None = None  # e.g. sample-10BT for fineweb_edu
    hf_split: str = "train"
    hf_revision: str | None = None  # e.g. refs/convert/parquet for a repo that still holds a loading script
    streaming: bool = False
    token_budget: int | None = None  # stop once this many training tokens are written
    # local files
    paths: list[str] = field(default_factory=list)  # files or globs
    format: str | None = None  # text | jsonl | parquet (inferred from suffix when None)
    text_field: str = "text"
    text_sample_by: str = "document"  # text files: one document per file (document) | paragraph | line
    # a document that cannot be read (not UTF-8 text, a jsonl line that is not a JSON object with a string
    # text field, a null parquet value) stops preparation, naming it; true skips and counts such documents
    skip_bad_documents: bool = False
    # shards and split
    val_tokens: int = 20_000  # held-out validation tokens: documents sampled from the stream (split_seed)
    # the validation documents are those of smallest key splitmix64(split_seed, document index): a uniform
    # sample of the stream (mars.data.split); null: the first val_tokens tokens (how datasets were split
    # before). Not for the embedded corpus, whose documents are shuffled with data.seed before the split
    split_seed: int | None = 1337
    shard_tokens: int = 100_000_000
    num_workers: int = 2
    seed: int = 1337  # shuffles the embedded corpus' documents
    # loader
    sequential: bool = False  # without-replacement windows instead of random ones
    verify: str = "cached"  # shard checksums on open: cached (re-hash only changed files) | full
