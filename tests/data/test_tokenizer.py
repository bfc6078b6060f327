import random

import pytest

from mars.data import tokenizer as tk


def test_known_ids_and_vocab():
    enc = tk.get_tokenizer()
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.n_vocab == 50257
    assert enc.eot_token == 50256
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]


@pytest.mark.parametrize(
    "text",
    [
        "plain ascii text.",
        "  leading and trailing   \n\n\t\twhitespace \r\n  ",
        "unicode: héllo wörld, 日本語のテキスト, emoji 😀🚀, ﬁ ligature, Ω≈ç√",
        "code:\n    def f(x):\n        return x ** 2  # comment\n",
        "",
    ],
)
def test_roundtrip(text):
    enc = tk.get_tokenizer()
    hf = tk.get_hf_tokenizer()
    assert enc.decode(enc.encode_ordinary(text)) == text
    assert hf.decode(hf(text)["input_ids"]) == text


def _varied_sample(n_chars: int = 6000) -> str:
    rng = random.Random(1234)
    pieces = [
        "The quick brown fox jumps over the lazy dog. ",
        "It's they're we've I'd you'll ",
        "1234567890 3.14159 -42 1e-8 ",
        "   multiple   spaces\tand\ttabs\n\n",
        "naïve café résumé Ångström ",
        "中文字符 日本語 한국어 ",
        "😀🙃🚀 ",
        "<html><body class='x'>{\"json\": [1, 2, 3]}</body></html> ",
        "def foo(bar):\n    return bar['baz']  # comment\n",
        "ALL CAPS SHOUTING!!! ??? ... --- ",
    ]
    out = []
    while sum(map(len, out)) < n_chars:
        out.append(rng.choice(pieces))
        if rng.random() < 0.3:
            out.append("".join(chr(rng.randint(32, 0x2FFF)) for _ in range(rng.randint(1, 8))))
    return "".join(out)


def test_tiktoken_and_hf_agree_token_for_token():
    enc = tk.get_tokenizer()
    hf = tk.get_hf_tokenizer()
    text = _varied_sample()
    assert len(text) >= 6000
    ids = enc.encode_ordinary(text)
    assert hf(text)["input_ids"] == ids
    # and with the document separator as a special token
    doc = "first doc<|endoftext|>second doc"
    assert hf(doc)["input_ids"] == enc.encode(doc, allowed_special="all")


def test_hf_tokenizer_is_not_empty():
    # GPT2TokenizerFast(vocab_file=..., merges_file=...) yields an empty vocabulary in current
    # transformers; ours must be the full one.
    hf = tk.get_hf_tokenizer()
    assert len(hf) == 50257
    assert hf.convert_tokens_to_ids("<|endoftext|>") == 50256
    assert hf.eos_token_id == 50256
    assert hf("Hello world")["input_ids"] == [15496, 995]


def test_hash_check_rejects_a_modified_file(tmp_path, monkeypatch):
    vocab, encoder = tk.bpe_files()
    bad = tmp_path / "data"
    bad.mkdir()
    (bad / "vocab.bpe").write_bytes(vocab.read_bytes() + b"x")
    (bad / "encoder.json").write_bytes(encoder.read_bytes())
    monkeypatch.setattr(tk.resources, "files", lambda pkg: tmp_path)
    with pytest.raises(tk.DataError, match="sha256"):
        tk.bpe_files()
