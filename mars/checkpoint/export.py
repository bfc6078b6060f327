"""A checkpoint as a Hugging Face model directory (scripts/export_hf.py)."""

from __future__ import annotations

import os
from pathlib import Path

from mars.checkpoint.load import load_model


def export_hf(
    path: str | os.PathLike, out_dir: str | os.PathLike, force: bool = False, average: bool = False
) -> Path:
    """Write the checkpoint at path (run dir, ckpt dir or step dir) as a Hugging Face model
    directory (model.safetensors, config.json, generation_config.json, tokenizer files) that
    AutoModelForCausalLM / AutoTokenizer.from_pretrained load offline: the class of the
    architecture's adapter (GPT2LMHeadModel for a GPT-2; mars.model.hf), with the tokenizer the
    run's data was prepared with (data.tokenizer). average=True: the averaged weights the run kept
    (train.average) instead of its model's. Returns out_dir."""
    from mars.data.tokenizer import get_hf_tokenizer, tokenizer_of_run
    from mars.model.hf import to_hf
    from mars.model.spec import spec_of

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise FileExistsError(
            f"{out} is not empty; choose another directory or pass --force to write over it"
        )
    model, info = load_model(path, average=average)
    tokenizer = get_hf_tokenizer(tokenizer_of_run(info.get("config")))
    hf = to_hf(model, tokenizer=tokenizer).eval()
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out, max_shard_size="1000GB")
    finish = getattr(spec_of(model).hf(), "finish_export", None)
    if finish is not None:
        finish(out, model)
    tokenizer.model_max_length = model.config.block_size
    tokenizer.save_pretrained(out)
    return out
