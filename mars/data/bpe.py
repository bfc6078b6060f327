"""Small byte-level BPE vocabularies trained on the embedded corpus: ``data.tokenizer=embedded-bpe-N``.

GPT-2's 50257 tokens make a CPU-scale model mostly vocabulary (a 2-layer, 64-wide GPT-2 holds 0.10M
parameters in its blocks beside a 3.2M embedding). ``embedded-bpe-N`` names a byte-level BPE of N
tokens (``<|endoftext|>`` = id 0, the 256 byte symbols, then merges), trained with the ``tokenizers``
library on the embedded corpus (mars.data.embedded, seed 1337), offline and deterministically: the
same corpus gives the same vocabulary, on any machine with the same Python version.

It is trained on first use (a few seconds) into ``data/tokenizers/embedded-bpe-N/`` of the checkout
(else of the current directory), under a lock and through a temporary directory renamed into place,
so concurrent first uses train it once. The directory is an ordinary Hugging Face tokenizer
(tokenizer.json, tokenizer_config.json), so everything that takes ``data.tokenizer=DIR`` takes it;
``bpe.json`` beside them records the recipe (vocabulary size, corpus seed and sha256, the Python and
tokenizers versions). A directory trained on another Python's corpus is refused in one line.

``train_bpe(texts, vocab_size, out_dir)`` trains one on any texts (tests use it on a small corpus).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from mars.errors import DataError

NAME_RE = re.compile(r"^embedded-bpe-(\d+)$")
EOT = "<|endoftext|>"
RECIPE = "bpe.json"
CORPUS_SEED = 1337  # data.seed's default: the embedded corpus' document order
MIN_VOCAB = 257 + 64  # the end-of-text token, 256 bytes, and some merges


def train_bpe(texts: list[str], vocab_size: int, out_dir: Path) -> Path:
    """Train a byte-level BPE of `vocab_size` tokens on `texts` and save it as a Hugging Face tokenizer
    directory (tokenizer.json, tokenizer_config.json) at out_dir; returns out_dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < MIN_VOCAB:
        raise DataError(f"a byte-level BPE needs at least {MIN_VOCAB} tokens (asked for {vocab_size})")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],  # id 0
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodes: no unknown token
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOT, eos_token=EOT, unk_token=EOT, clean_up_tokenization_spaces=False
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out_dir))
    return out_dir


def tokenizers_root() -> Path:
    from mars.files import project_root

    return (project_root() or Path.cwd()) / "data" / "tokenizers"


def builtin_dir(name: str) -> Path | None:
    """The directory of ``data.tokenizer=embedded-bpe-N`` (trained on first use); None for other names."""
    m = NAME_RE.match(str(name))
    if m is None:
        return None
    vocab_size = int(m.group(1))
    if vocab_size < MIN_VOCAB or vocab_size > 1 << 16:
        raise DataError(
            f"data.tokenizer={name}: the vocabulary size must lie in [{MIN_VOCAB}, 65536] "
            "(e.g. embedded-bpe-4096)"
        )
    out = tokenizers_root() / name
    if not (out / RECIPE).is_file():
        _train_once(name, vocab_size, out)
    _check_recipe(name, out)
    return out


def _recipe(vocab_size: int) -> dict:
    import sys

    import tokenizers

    from mars.data.embedded import corpus_fingerprint, embedded_documents

    docs = embedded_documents(CORPUS_SEED)
    return {
        "vocab_size": vocab_size,
        "corpus": "embedded",
        "corpus_seed": CORPUS_SEED,
        "corpus_sha256": corpus_fingerprint(docs),
        "documents": len(docs),
        "python": ".".join(map(str, sys.version_info[:3])),
        "tokenizers": tokenizers.__version__,
    }


def _train_once(name: str, vocab_size: int, out: Path) -> None:
    """Train into a temporary dir and rename it to `out`, holding a lock so that it happens once."""
    from mars.data.embedded import embedded_documents

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock = open(out.parent / f".{name}.lock", "w")
    except OSError as e:
        raise DataError(
            f"data.tokenizer={name}: cannot create {out} ({e.strerror or e}); train it where you can write "
            f"with mars.data.bpe.train_bpe and pass its directory as data.tokenizer"
        ) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / RECIPE).is_file():
            return  # another process trained it while this one waited
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=out.parent))
        try:
            recipe = _recipe(vocab_size)
            train_bpe(embedded_documents(CORPUS_SEED), vocab_size, tmp)
            (tmp / RECIPE).write_text(json.dumps(recipe, indent=2) + "\n")
            if out.exists():  # a directory without its recipe: an interrupted copy by hand; keep it
                os.replace(out, out.with_name(f"{out.name}.incomplete-{os.getpid()}"))
            os.replace(tmp, out)
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)


def _check_recipe(name: str, out: Path) -> None:
    import sys

    try:
        recipe = json.loads((out / RECIPE).read_text())
    except (OSError, ValueError) as e:
        raise DataError(
            f"data.tokenizer={name}: {out / RECIPE} cannot be read ({e}); move {out} aside (it is then "
            "trained again)"
        ) from None
    here = ".".join(map(str, sys.version_info[:3]))
    if recipe.get("python") != here:
        raise DataError(
            f"data.tokenizer={name}: {out} was trained on the embedded corpus of Python "
            f"{recipe.get('python')}, this is Python {here} (another corpus): move {out} aside and it is "
            "trained again on first use"
        )
