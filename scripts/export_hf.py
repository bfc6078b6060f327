"""Export a checkpoint as a Hugging Face model directory (weights, config, tokenizer): GPT2LMHeadModel
for model.arch=gpt2, LlamaForCausalLM for model.arch=llama.

    python scripts/export_hf.py RUN_DIR_OR_CKPT OUT_DIR [--force] [--average]

RUN_DIR_OR_CKPT: a run directory (its latest complete checkpoint is used), RUN_DIR/ckpt, or one
RUN_DIR/ckpt/step_XXXXXXXX directory. The result loads offline with
transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR) and AutoTokenizer.from_pretrained(OUT_DIR);
the tokenizer is the one the run's data was prepared with (data.tokenizer). --average exports the
averaged weights the run kept (train.average) instead of the model's.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mars.checkpoint.export import export_hf
from mars.entry import EXIT_FAILED, EXIT_USAGE, ArgumentParser
from mars.errors import CheckpointError, ConfigError, DataError
from mars.files import nearest_existing, try_create_dir_in
from mars.plugins import load_plugins


def _error(message: object, status: int = EXIT_FAILED) -> int:
    """One ``error:`` line on stderr, a message of several lines (YAML's) joined as mars.entry.fail and
    train.py join them; returns the exit status."""
    print(
        "error: " + " ".join(line.strip() for line in str(message).splitlines() if line.strip()),
        file=sys.stderr,
    )
    return status


def _check_writable(out: Path) -> str | None:
    """Why OUT_DIR cannot be written (None: it can), found before the checkpoint is read."""
    base = nearest_existing(out.absolute())
    if base == out.absolute() and not base.is_dir():
        return None  # a file named OUT_DIR: export_hf says so
    try:
        try_create_dir_in(base)
    except NotADirectoryError:
        return f"OUT_DIR {out}: {base} is a file, not a directory; choose another OUT_DIR"
    except OSError as e:
        return (
            f"OUT_DIR {out}: cannot create directories in {base} ({e.strerror or e}); choose another OUT_DIR"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="export_hf.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("path", metavar="RUN_DIR_OR_CKPT", help="run dir, RUN_DIR/ckpt, or a step dir")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="directory to write the Hugging Face model to")
    parser.add_argument("--force", action="store_true", help="write into OUT_DIR even if it is not empty")
    parser.add_argument(
        "--average", action="store_true", help="the averaged weights of the run (train.average)"
    )
    args = parser.parse_args(argv)
    try:
        load_plugins()  # a plugin's architecture must be registered before its model.json is read
    except ConfigError as e:
        return _error(e, EXIT_USAGE)
    problem = _check_writable(Path(args.out_dir))
    if problem:
        return _error(problem)
    try:
        if args.average:  # before anything is read or written
            from mars.checkpoint import find_checkpoint, has_average
            from mars.checkpoint.load import no_average

            step_dir = find_checkpoint(args.path)
            if not has_average(step_dir):
                why = no_average(step_dir)
                return _error(f"--average: {why}; export without --average for its model's weights")
        out = export_hf(args.path, args.out_dir, force=args.force, average=args.average)
    except (CheckpointError, FileExistsError, DataError) as e:
        return _error(e)
    except OSError as e:  # e.g. the disk filled up while writing
        return _error(f"cannot write {args.out_dir} ({e}); free space or choose another OUT_DIR")
    print(f"wrote {out} (load with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
