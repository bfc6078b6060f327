"""embedded-bpe-N: a byte-level BPE trained deterministically on the embedded corpus (mars.data.bpe)."""

from __future__ import annotations

import json

import pytest

import mars.data.bpe as bpe
import mars.data.tokenizer as tokenizer
from mars.data.tokenizer import encode_batch, get_hf_tokenizer, tokenizer_info
from mars.errors import DataError

TEXTS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Return the number of items in a container; raise TypeError when it has no length.",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich: ünïcödé bytes too.",
] * 20


@pytest.fixture
def small_corpus(monkeypatch, tmp_path):
    """builtin_dir trains on TEXTS (not the whole corpus) into tmp_path/data/tokenizers."""
    import mars.data.embedded as embedded

    monkeypatch.setattr(embedded, "embedded_documents", lambda seed=1337: list(TEXTS))
    monkeypatch.setattr(bpe, "tokenizers_root", lambda: tmp_path / "data" / "tokenizers")
    caches = (tokenizer_info, tokenizer._cached_hf)  # names are cached per process
    for c in caches:
        c.cache_clear()
    yield tmp_path / "data" / "tokenizers"
    for c in caches:
        c.cache_clear()


def test_training_is_deterministic_and_every_byte_encodes(tmp_path):
    a = bpe.train_bpe(TEXTS, 400, tmp_path / "a")
    b = bpe.train_bpe(TEXTS, 400, tmp_path / "b")
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    tok = get_hf_tokenizer(str(a))
    assert tok.convert_tokens_to_ids(bpe.EOT) == 0 and tok.eos_token_id == 0
    text = "never seen: Ωμέγα \u2603 \x00 tabs\tand\nnewlines"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text  # byte-level: no unknown token, an exact round trip
    assert len(tok) <= 400


def test_a_builtin_name_is_trained_on_first_use_and_then_loaded(small_corpus):
    info = tokenizer_info("embedded-bpe-330")
    assert (info.vocab_size, info.eot_id) == (330, 0)
    recipe = json.loads((small_corpus / "embedded-bpe-330" / "bpe.json").read_text())
    assert recipe["vocab_size"] == 330 and recipe["documents"] == len(TEXTS)
    stamp = (small_corpus / "embedded-bpe-330" / "tokenizer.json").stat().st_mtime_ns
    assert encode_batch(["the lazy dog"], "embedded-bpe-330")[0]  # loaded, not trained again
    assert (small_corpus / "embedded-bpe-330" / "tokenizer.json").stat().st_mtime_ns == stamp


def test_a_tokenizer_of_another_pythons_corpus_or_size_is_refused(small_corpus):
    tokenizer_info("embedded-bpe-330")
    recipe = small_corpus / "embedded-bpe-330" / "bpe.json"
    recipe.write_text(json.dumps({**json.loads(recipe.read_text()), "python": "3.0.0"}))
    tokenizer_info.cache_clear()
    tokenizer._cached_hf.cache_clear()
    other_python = r"embedded corpus of Python 3\.0\.0, this is Python .*move .* aside"
    with pytest.raises(DataError, match=other_python):
        tokenizer_info("embedded-bpe-330")
    with pytest.raises(DataError, match=r"embedded-bpe-100: the vocabulary size must lie in"):
        tokenizer_info("embedded-bpe-100")


def test_the_config_takes_it_and_sizes_the_model_by_it(small_corpus):
    from mars.errors import ConfigError
    from mars.train.cli import compose_config
    from mars.train.config import validate

    validate(compose_config(["data.tokenizer=embedded-bpe-330", "model.vocab_size=384"]))
    with pytest.raises(ConfigError, match=r"model.vocab_size=256 is smaller than .*330 tokens"):
        validate(compose_config(["data.tokenizer=embedded-bpe-330", "model.vocab_size=256"]))
