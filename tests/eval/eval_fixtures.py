"""Helpers of the eval tests (a module name of its own: test dirs share one import namespace)."""

import dataclasses
import json
from pathlib import Path

import torch
import yaml

from mars.checkpoint.model_dir import save_model
from mars.model.gpt import GPT, GPTConfig
from mars.model.llama import Llama, LlamaConfig

TINY = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64)
TINY_LLAMA = LlamaConfig(n_layer=1, n_head=4, n_kv_head=2, n_embd=32, block_size=64, multiple_of=32,
                         tie_embeddings=False)  # fmt: skip


def tiny_gpt(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(TINY)


def tiny_llama(seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    return Llama(TINY_LLAMA)


def write_checkpoint(
    run_dir: Path, model: GPT | Llama, step: int, tokens: int, tokenizer: str = "gpt2"
) -> Path:
    """RUN_DIR/ckpt/step_XXXXXXXX as the trainer writes it (minus train_state.pt, unused here)."""
    step_dir = run_dir / "ckpt" / f"step_{step:08d}"
    save_model(model, step_dir)
    run_config = {
        "model": dataclasses.asdict(model.config),
        "data": {"tokenizer": tokenizer},
        "train": {"max_steps": step},
    }
    (step_dir / "config.yaml").write_text(yaml.safe_dump(run_config))
    (step_dir / "meta.json").write_text(json.dumps({"step": step, "tokens": tokens, "wandb_run_id": None}))
    return step_dir


def byte_bpe(out: Path, vocab_size: int = 300) -> Path:
    """A small byte-level BPE tokenizer trained here (offline, about a second), saved as transformers does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|eos|>"], initial_alphabet=alphabet
    )
    tok.train_from_iterator(
        ["the quick brown fox jumps over the lazy dog. " * 20, "What is two plus two?"], trainer
    )
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>").save_pretrained(out)
    return out
