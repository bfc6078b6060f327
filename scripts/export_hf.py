"""Export a checkpoint as a Hugging Face model directory (weights, config, tokenizer): GPT2LMHeadModel
for model.arch=gpt2, LlamaForCausalLM for model.arch=llama.

    python scripts/export_hf.py RUN_DIR_OR_CKPT OUT_DIR [--force]

RUN_DIR_OR_CKPT: a run directory (its latest complete checkpoint is used), RUN_DIR/ckpt, or one
RUN_DIR/ckpt/step_XXXXXXXX directory. The result loads offline with
transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR) and AutoTokenizer.from_pretrained(OUT_DIR);
the tokenizer is the one the run's data was prepared with (data.tokenizer).
"""

from __future__ import annotations

import sys

from mars.checkpoint import CheckpointError
from mars.checkpoint.export import export_hf
from mars.data.errors import DataError
from mars.entry import ArgumentParser


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="export_hf.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", metavar="RUN_DIR_OR_CKPT", help="run dir, RUN_DIR/ckpt, or a step dir")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="directory to write the Hugging Face model to")
    parser.add_argument("--force", action="store_true", help="write into OUT_DIR even if it is not empty")
    args = parser.parse_args(argv)
    try:
        out = export_hf(args.path, args.out_dir, force=args.force)
    except (CheckpointError, FileExistsError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out} (load with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
