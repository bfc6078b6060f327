"""data.tokenizer = a Hugging Face tokenizer directory, offline: tokenizers these tests train (or build)
themselves. The shards hold exactly its ids, the manifest records which tokenizer made them, another
tokenizer is refused, a vocabulary above 65536 tokens gets uint32 shards, and a model whose
vocab_size is smaller than the tokenizer's vocabulary is refused when the config is composed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from data_helpers import local_cfg, make_docs, write_jsonl

from mars.data import ensure_prepared, open_dataset
from mars.data import tokenizer as tk
from mars.data.prepare import prepare
from mars.data.tokenizer import encode_batch, get_hf_tokenizer, tokenizer_info
from mars.errors import DataError, ManifestError

EOS = "<|eos|>"


def train_bpe(out: Path, docs: list[str], vocab_size: int) -> Path:
    """A byte-level BPE trained on docs (about a second), saved as transformers saves tokenizers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS).save_pretrained(out)
    return out


def word_level(out: Path, n_words: int) -> Path:
    """A word-level tokenizer of n_words made-up words (w0 ... w{n-1}) after the end-of-text token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {EOS: 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(n_words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, unk_token="[UNK]").save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Path:
    return train_bpe(tmp_path_factory.mktemp("tok") / "bpe", make_docs(200, seed=5), 300)


def shard_tokens(directory: Path, split: str) -> np.ndarray:
    manifest = json.loads((directory / "manifest.json").read_text())
    dtype = np.dtype(manifest["dtype"])
    return np.concatenate(
        [np.fromfile(directory / s["file"], dtype=dtype) for s in manifest["splits"][split]["shards"]]
    )


def test_shards_hold_the_tokenizers_ids_and_the_manifest_says_which_tokenizer(tmp_path, bpe):
    docs = make_docs(40)
    src = write_jsonl(tmp_path / "docs.jsonl", docs)
    cfg = local_cfg(tmp_path / "data", [src], tokenizer=str(bpe), val_tokens=0)
    out = prepare(cfg, progress_bar=False)
    assert out == tmp_path / "data" / "local-bpe"  # not where GPT-2's shards of the same source go
    manifest = json.loads((out / "manifest.json").read_text())
    info = tokenizer_info(str(bpe))
    assert (manifest["tokenizer"], manifest["vocab_size"], manifest["eot_id"]) == (str(bpe), 300, 0)
    assert manifest["tokenizer_sha256"] == info.sha256 == manifest["config"]["tokenizer_sha256"]
    assert manifest["dtype"] == "uint16"
    want = np.concatenate([np.array([*ids, info.eot_id]) for ids in encode_batch(docs, str(bpe))])
    assert np.array_equal(shard_tokens(out, "train"), want)
    tok = get_hf_tokenizer(str(bpe))
    first = shard_tokens(out, "train")[: len(encode_batch(docs[:1], str(bpe))[0])]
    assert tok.decode(first.tolist()) == docs[0]  # the ids are the tokenizer's: they decode back
    assert open_dataset(cfg, vocab_size=320).train_tokens == len(want)


def test_shards_of_another_tokenizer_are_refused(tmp_path, bpe):
    src = write_jsonl(tmp_path / "docs.jsonl", make_docs(40))
    cfg = local_cfg(tmp_path / "data", [src], tokenizer=str(bpe), val_tokens=0, dir="shared")
    prepare(cfg, progress_bar=False)
    gpt2 = local_cfg(tmp_path / "data", [src], val_tokens=0, dir="shared")
    with pytest.raises(ManifestError, match=r"tokenizer: prepared '.*bpe', config None") as e:
        ensure_prepared(gpt2)
    assert "\n" not in str(e.value)
    # the same tokenizer path, retrained since: its vocabulary fingerprint differs
    path = train_bpe(tmp_path / "tok", make_docs(200, seed=6), 280)
    cfg2 = local_cfg(tmp_path / "data", [src], tokenizer=str(path), val_tokens=0)
    prepare(cfg2, progress_bar=False)
    shutil.rmtree(path)
    shutil.copytree(bpe, path)
    tk.tokenizer_info.cache_clear()  # a process sees one version of a tokenizer: forget this one's
    tk._cached_hf.cache_clear()
    with pytest.raises(
        ManifestError, match=r"tokenizer_sha256: prepared '[0-9a-f]{64}', config '[0-9a-f]{64}'"
    ):
        ensure_prepared(cfg2)


def test_a_vocabulary_above_65536_tokens_gets_uint32_shards(tmp_path):
    big = word_level(tmp_path / "words", 70_000)
    info = tokenizer_info(str(big))
    assert info.vocab_size == 70_002 and info.dtype == "uint32"
    docs = [" ".join(f"w{i}" for i in range(k, 70_000, 9973)) for k in range(30)]
    src = write_jsonl(tmp_path / "docs.jsonl", docs)
    cfg = local_cfg(tmp_path / "data", [src], tokenizer=str(big), val_tokens=0)
    out = prepare(cfg, progress_bar=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dtype"] == "uint32"
    tokens = shard_tokens(out, "train")
    shard = manifest["splits"]["train"]["shards"][0]
    assert (out / shard["file"]).stat().st_size == 4 * shard["tokens"]
    assert tokens.max() == shard["max_token"] == max(i for k in range(30) for i in range(k, 70_000, 9973)) + 2
    want = np.concatenate([np.array([*ids, 0]) for ids in encode_batch(docs, str(big))])
    assert np.array_equal(tokens, want)
    dataset = open_dataset(cfg, vocab_size=70_016)
    assert dataset.train[0].dtype == np.uint32 and dataset.train_tokens == len(want)


def test_a_tokenizer_without_an_end_of_text_token_is_refused(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    out = tmp_path / "no_eos"
    PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "b": 1}, "a"))
    ).save_pretrained(out)
    with pytest.raises(DataError, match=r"has no end-of-text \(eos\) token"):
        tokenizer_info(str(out))


def test_composition_refuses_a_model_vocabulary_smaller_than_the_tokenizers(bpe, tmp_path):
    from mars.errors import ConfigError
    from mars.train.cli import compose_config
    from mars.train.config import validate

    cfg = compose_config(["model=llama_tiny", f"data.tokenizer={bpe}", "model.vocab_size=256"])
    with pytest.raises(
        ConfigError,
        match=rf"model\.vocab_size=256 is smaller than the vocabulary of data\.tokenizer={bpe} "
        r"\(300 tokens\); set model\.vocab_size=320",
    ):
        validate(cfg)
    validate(compose_config(["model=llama_tiny", f"data.tokenizer={bpe}", "model.vocab_size=320"]))
    with pytest.raises(
        ConfigError,
        match=r"model\.vocab_size=50000 is smaller than the vocabulary of data\.tokenizer=gpt2 "
        r"\(50257 tokens\)",
    ):
        validate(compose_config(["model.vocab_size=50000"]))
    with pytest.raises(ConfigError, match=r"data\.tokenizer=.*missing: no such directory"):
        validate(compose_config([f"data.tokenizer={tmp_path / 'missing'}"]))


def test_tokenizer_info_reads_the_files_as_transformers_does(tmp_path):
    """tokenizer_info of a tokenizer.json directory comes from the `tokenizers` library alone (no
    transformers import at every config check), equal to transformers' answer; a config naming a special
    token the vocabulary lacks is left to transformers (which adds it)."""
    from transformers import AutoTokenizer

    bpe = train_bpe(tmp_path / "bpe", make_docs(200), vocab_size=300)
    quick = tk._files_info(str(bpe))
    slow = AutoTokenizer.from_pretrained(str(bpe))
    assert quick == tk._info(str(bpe), slow.get_vocab(), len(slow), slow.eos_token_id)
    config = json.loads((bpe / "tokenizer_config.json").read_text())
    (bpe / "tokenizer_config.json").write_text(json.dumps({**config, "pad_token": "<|pad|>"}))
    assert tk._files_info(str(bpe)) is None  # transformers would add <|pad|> to the vocabulary
    assert tk._files_info(str(tmp_path / "missing")) is None
