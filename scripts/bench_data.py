#!/usr/bin/env python
"""Preparation throughput next to raw tiktoken on the same text.

    python scripts/bench_data.py [--workers 2] [--mb 24] [--val-tokens 100000] [--split-seed 1337 | head]
                                 [--json FILE]

The text is the embedded corpus (real English prose), repeated up to --mb megabytes. "raw" is
tiktoken's ``encode_ordinary_batch`` over all documents in this process (its default 8 threads);
"prepare" is the full pipeline of scripts/prepare_data.py on the same documents: worker
processes (started inside the timing), EOT insertion, the validation split (by default the
documents sampled over the whole stream with data.split_seed, as data=local and the Hugging Face
sources draw it; ``--split-seed head``: the first --val-tokens, the old rule), uint16 shards, sha256,
manifest. Both rates count the same tokens (the documents' tokens, not the EOT separators). Target:
prepare >= 0.7 x raw.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=2, help="tokenizer processes of the prepare pipeline")
    parser.add_argument("--mb", type=float, default=24.0, help="megabytes of text to tokenize")
    parser.add_argument("--val-tokens", type=int, default=100_000, help="tokens of the validation split")
    parser.add_argument(
        "--split-seed",
        default="1337",
        help="data.split_seed of the validation sample, or 'head' for the first --val-tokens (the old rule)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()
    if args.split_seed != "head" and not args.split_seed.lstrip("-").isdigit():
        parser.error(f"--split-seed {args.split_seed}: give an integer seed or 'head'")
    split = {} if args.split_seed == "head" else {"split_seed": int(args.split_seed)}
    rule = f"sampled, split_seed {split['split_seed']}" if split else "the head of the stream"

    from mars.data.embedded import embedded_documents
    from mars.data.sources import ListSource
    from mars.data.tokenizer import get_tokenizer
    from mars.data.writer import write_shards

    corpus = embedded_documents()
    corpus_chars = sum(len(d) for d in corpus)
    repeats = max(1, round(args.mb * 1e6 / corpus_chars))
    docs = corpus * repeats
    chars = corpus_chars * repeats
    enc = get_tokenizer()

    t0 = time.perf_counter()
    tokens = sum(len(ids) for ids in enc.encode_ordinary_batch(docs))
    raw_s = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        write_shards(
            ListSource(docs, name="bench"),
            Path(tmp),
            {"name": "bench", **split},
            val_tokens=args.val_tokens,
            shard_tokens=100_000_000,
            workers=args.workers,
            progress_bar=False,
        )
        prep_s = time.perf_counter() - t0

    raw_rate, prep_rate = tokens / raw_s, tokens / prep_s
    rows = [
        {
            "name": "tiktoken_encode_ordinary_batch",
            "tokens_per_s": raw_rate,
            "tokens": tokens,
            "chars": chars,
            "seconds": raw_s,
        },
        {
            "name": f"prepare_{args.workers}_workers",
            "val_tokens": args.val_tokens,
            "split": rule,
            "tokens_per_s": prep_rate,
            "tokens": tokens,
            "chars": chars,
            "seconds": prep_s,
            "ratio_to_baseline": prep_rate / raw_rate,
            "baseline": "tiktoken_encode_ordinary_batch",
        },
    ]
    print(f"text: {chars / 1e6:.1f} MB, {tokens:,} tokens ({len(docs):,} documents)")
    print(f"validation split: {args.val_tokens:,} tokens, {rule}")
    print(f"raw tiktoken encode_ordinary_batch : {raw_rate:12,.0f} tokens/s")
    print(
        f"prepare, {args.workers} workers            : {prep_rate:12,.0f} tokens/s  "
        f"({prep_rate / raw_rate:.2f} x raw; target >= 0.70)"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
