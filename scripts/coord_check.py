"""The coordinate check of muP (docs/mup.md): train a model a few steps at several widths, under SP and
under muP, and draw the mean absolute activation of each layer kind (embedding, attention output, MLP
output, logits) against width. Flat under muP; growing under SP.

    python scripts/coord_check.py                                       # GPT-2, AdamW, widths 64-512
    python scripts/coord_check.py --arch llama --optimizer muon --lr 0.05 --out coord_check/llama_muon

The model is the CPU-scale study's (2 layers, 2 heads, 64-token context, the embedded corpus in its
4096-token BPE vocabulary), muP's base width the smallest width. Writes OUT/coord_check.png and
OUT/coord_check.json, and prints the slope of log mean |x| against log width at the last step (0: flat,
1: proportional to the width). The logic lives in mars.train.coord_check.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="gpt2", help="model.arch (gpt2, llama)")
    ap.add_argument("--optimizer", default="adamw", help="a registered optimizer (its config's defaults)")
    ap.add_argument("--lr", type=float, default=1e-2, help="the constant learning rate (default 1e-2)")
    ap.add_argument("--widths", default="64,128,256,512", help="n_embd values, comma separated")
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps (default 5)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds averaged (default 2)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--tokenizer", default="embedded-bpe-4096", help="data.tokenizer of the embedded corpus")
    ap.add_argument("--out", default="coord_check", help="output directory (default coord_check/)")
    args = ap.parse_args(argv)
    try:
        widths = sorted({int(w) for w in args.widths.split(",")})
    except ValueError:
        ap.error(f"--widths={args.widths!r}: give whole widths separated by commas, e.g. 64,128,256")
    if len(widths) < 2:
        ap.error(f"--widths={args.widths!r}: give at least two widths")

    import numpy as np
    import torch

    from mars.data import DataConfig, open_dataset
    from mars.data.tokenizer import tokenizer_info
    from mars.optim.mup import refusal
    from mars.train.coord_check import KINDS, coord_data, figure, slope

    if refusal(args.optimizer):
        print(f"error: {refusal(args.optimizer)}", file=sys.stderr)
        return 2
    vocab = 64 * -(-tokenizer_info(args.tokenizer).vocab_size // 64)  # padded to a multiple of 64
    data = open_dataset(DataConfig(tokenizer=args.tokenizer), vocab_size=vocab)
    tokens = torch.from_numpy(np.concatenate([np.asarray(a) for a in data.train]).astype(np.int64))
    model = {"arch": args.arch, "n_layer": args.layers, "n_head": args.heads, "block_size": args.block_size}
    model.update(vocab_size=vocab, mup_base_width=widths[0])
    if args.arch == "llama":
        model.update(multiple_of=64)
    try:
        optimizer = {"name": args.optimizer, "lr": args.lr}
        records = coord_data(
            model,
            widths,
            ("sp", "mup"),
            optimizer,
            tokens,
            steps=args.steps,
            seeds=range(args.seeds),
            batch_size=args.batch_size,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    what = f"{args.arch}, {args.optimizer} lr {args.lr:g}, widths {widths} (muP base {widths[0]})"
    figure(records, out / "coord_check.png", title=what)
    slopes = {p: {k: slope(records, p, k, args.steps) for k in KINDS} for p in ("sp", "mup")}
    (out / "coord_check.json").write_text(
        json.dumps({"setting": vars(args), "slopes": slopes, "records": [asdict(r) for r in records]})
    )
    print(f"{what}: slope of log mean|x| against log width after {args.steps} steps")
    print("| parametrization | " + " | ".join(KINDS) + " |")
    print("|---|" + "---:|" * len(KINDS))
    for p, row in slopes.items():
        print(f"| {p} | " + " | ".join(f"{row[k]:+.2f}" for k in KINDS) + " |")
    print(f"wrote {out / 'coord_check.png'} and {out / 'coord_check.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
