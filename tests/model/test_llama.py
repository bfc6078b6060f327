"""The LLaMA-style model (mars.model.llama) against transformers' LlamaForCausalLM, its rotary tables,
initialisation, parameter counts of the presets against their sources, and its bad configs."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from mars.model.hf_llama import from_hf, to_hf
from mars.model.llama import (
    Llama,
    LlamaConfig,
    count_params,
    flops_per_token,
    mlp_hidden,
    rope_tables,
    validate_config,
)
from mars.model.spec import arch

SMALL = dict(n_layer=2, n_head=4, n_embd=64, block_size=32, vocab_size=96, multiple_of=32, rope_theta=500.0)


def make_llama(**overrides) -> Llama:
    """Every parameter randomised (the RMSNorm gains too), so a mapping that drops or mixes up any
    tensor shows up in the logits."""
    model = Llama(LlamaConfig(**{**SMALL, **overrides}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
    return model.eval()


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("n_kv_head", [None, 2, 1], ids=["mha", "gqa", "mqa"])
def test_logits_equal_exported_llama_for_causal_lm_and_import_gives_the_model_back(tie, n_kv_head):
    model = make_llama(tie_embeddings=tie, n_kv_head=n_kv_head)
    hf = to_hf(model)
    assert type(hf).__name__ == "LlamaForCausalLM" and not hf.training
    assert hf.config.tie_word_embeddings is tie
    assert hf.config.num_key_value_heads == (n_kv_head or 4)
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) is tie
    idx = torch.randint(0, 96, (3, 32))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx)[0], rtol=0, atol=1e-5)
        # a prefix, too: the rotary tables are sliced, not recomputed for the length
        torch.testing.assert_close(hf(idx[:, :7]).logits, model(idx[:, :7])[0], rtol=0, atol=1e-5)
    back = from_hf(hf)
    assert back.config == model.config  # mlp_hidden null (the 8/3 rule) and n_kv_head kept as given
    assert_same_state(back, model)
    assert (back.lm_head.weight is back.model.embed_tokens.weight) is tie


def test_import_of_a_plain_transformers_llama_and_what_it_refuses():
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM

    hc = HFConfig(
        vocab_size=80, hidden_size=32, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=16, rms_norm_eps=1e-6, rope_theta=1234.0,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(3)
    hf = LlamaForCausalLM(hc).eval()
    ours = from_hf(hf)
    c = ours.config
    assert (c.n_kv_head, mlp_hidden(c), c.norm_eps, c.rope_theta, c.tie_embeddings) == (
        2,
        72,
        1e-6,
        1234.0,
        False,
    )
    idx = torch.randint(0, 80, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(ours(idx)[0], hf(idx).logits, rtol=0, atol=1e-5)
    hf.config.hidden_act = "gelu"
    with pytest.raises(ValueError, match=r"hidden_act='gelu' \(we use 'silu'\)"):
        from_hf(hf)


def test_export_dir_has_both_rope_spellings_and_loads_offline(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mars.checkpoint.export import export_hf
    from mars.checkpoint.model_dir import save_model

    model = make_llama(vocab_size=50304, tie_embeddings=False, n_kv_head=2)
    save_model(model, tmp_path / "ckpt")
    out = export_hf(tmp_path / "ckpt", tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["rope_theta"] == 500.0 and config["rope_parameters"]["rope_theta"] == 500.0  # 4.x and 5.x
    assert config["eos_token_id"] == 50256  # GPT-2's <|endoftext|>: the default data.tokenizer
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    idx = torch.tensor([tok("The rotary layout is transformers' own.")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx)[0], rtol=0, atol=1e-5)


def test_rotary_tables_are_float32_real_and_rebuilt_after_meta_init_and_casts():
    c = LlamaConfig(**SMALL)
    cos, sin = rope_tables(c)
    assert cos.dtype == sin.dtype == torch.float32 and cos.shape == (32, 16)
    # position t, pair i: angle t / theta^(2i/d), the same in both halves of the head (rotate_half)
    t, i, d = 5, 3, 16
    assert cos[t, i].item() == pytest.approx(math.cos(t / 500.0 ** (2 * i / d)), abs=1e-6)
    assert torch.equal(cos[:, : d // 2], cos[:, d // 2 :]) and torch.equal(sin[:, : d // 2], sin[:, d // 2 :])

    model = Llama.empty(c, "cpu", dtype=torch.bfloat16)  # built on meta, materialised by to_empty
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert model.rope_cos.dtype == torch.float32 and torch.equal(model.rope_cos, cos)
    assert torch.equal(model.rope_sin, sin)
    assert not any("rope" in k for k in model.state_dict())  # non-persistent: never in a checkpoint

    model = make_llama()
    model.to(torch.bfloat16)  # nn.Module.to casts float buffers too
    assert model.rope_cos.dtype == torch.bfloat16
    model(torch.zeros(1, 4, dtype=torch.long))
    assert model.rope_cos.dtype == torch.float32 and torch.equal(model.rope_cos, cos)


def test_initialisation_is_a_function_of_the_seed_with_scaled_residual_projections():
    c = LlamaConfig(n_layer=4, n_head=4, n_kv_head=2, n_embd=256, block_size=16, vocab_size=512,
                    multiple_of=64, tie_embeddings=False)  # fmt: skip

    def init(seed):
        model = Llama.empty(c, "cpu")
        model.init_weights(torch.Generator().manual_seed(seed))
        return model

    a, b, other = init(1), init(1), init(2)
    assert_same_state(a, b)
    assert not torch.equal(a.lm_head.weight, other.lm_head.weight)
    layer = a.model.layers[0]
    residual = 0.02 / math.sqrt(2 * 4)
    for w, std in [
        (layer.self_attn.q_proj.weight, 0.02),
        (layer.self_attn.k_proj.weight, 0.02),
        (layer.mlp.up_proj.weight, 0.02),
        (layer.self_attn.o_proj.weight, residual),
        (layer.mlp.down_proj.weight, residual),
        (a.model.embed_tokens.weight, 0.02),
        (a.lm_head.weight, 0.02),
    ]:
        assert w.std().item() == pytest.approx(std, rel=0.05) and abs(w.mean().item()) < std / 10
    assert torch.equal(layer.input_layernorm.weight, torch.ones(256))
    assert layer.self_attn.k_proj.weight.shape == (128, 256)  # 2 key/value heads of 64
    assert layer.mlp.gate_proj.weight.shape == (704, 256)  # int(8/3 x 256) = 682 -> multiple of 64
    tied = Llama(dataclasses.replace(c, tie_embeddings=True))
    assert tied.lm_head.weight is tied.model.embed_tokens.weight


# (preset, non-embedding parameters, all parameters): our counts, printed in docs/llama.md, and the
# source's headline figure they must round to (Semenov et al. 2025: 124M, 210M, 720M; Wen et al. 2025:
# a 1.2B body, i.e. without the vocabulary matrices)
PRESET_COUNTS = [
    ("llama_tiny", 2_951_424, 28_707_072, None),
    ("llama_124m", 84_953_856, 123_587_328, 124e6),
    ("llama_210m", 169_906_944, 208_540_416, 210e6),
    ("llama_720m", 616_613_888, 719_636_480, 720e6),
    ("llama_1_2b", 1_208_059_392, 1_362_593_280, 1.2e9),
]


@pytest.mark.parametrize(
    "preset, non_embedding, total, source", PRESET_COUNTS, ids=[p[0] for p in PRESET_COUNTS]
)
def test_preset_parameter_counts_match_the_sources(preset, non_embedding, total, source):
    import yaml

    from mars.model.spec import model_config

    path = f"{__file__.rsplit('/tests/', 1)[0]}/configs/model/{preset}.yaml"
    raw = yaml.safe_load(open(path).read())
    c = model_config({k: v for k, v in raw.items() if k != "defaults"})
    with torch.device("meta"):
        model = Llama(c)
    assert model.num_params(non_embedding=True) == count_params(c, True) == non_embedding
    assert model.num_params(non_embedding=False) == count_params(c, False) == total
    if source is not None:
        counted = non_embedding if preset == "llama_1_2b" else total
        assert abs(counted - source) / source < 0.015, (preset, counted, source)
    # FLOPs per token: 6 x the matmul weights (blocks + head) + the attention term
    head = c.n_embd * c.vocab_size
    matmul = non_embedding - c.n_layer * 2 * c.n_embd - c.n_embd + head  # minus the RMSNorm gains
    assert flops_per_token(c) == 6 * matmul + 12 * c.n_layer * c.n_embd * c.block_size
    assert arch("llama").flops_per_token(c, 64) == 6 * matmul + 12 * c.n_layer * c.n_embd * 64


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(n_kv_head=3), r"model\.n_kv_head=3 must divide model\.n_head=4"),
        (dict(n_embd=72, n_head=8), r"72 / 8 = 9 is odd: rotary embeddings rotate pairs"),
        (dict(mlp_hidden=0), r"model\.mlp_hidden=0 must be positive"),
        (dict(mlp_hidden=-4), r"model\.mlp_hidden=-4 must be positive"),
        (dict(n_embd=66), r"model\.n_embd=66 must be a multiple of model\.n_head=4"),
        (dict(norm_eps=0.0), r"model\.norm_eps=0\.0 must be > 0"),
    ],
)
def test_bad_configs_are_one_line_naming_the_key(change, message):
    with pytest.raises(ValueError, match=message) as e:
        validate_config(LlamaConfig(**{**SMALL, **change}))
    assert "\n" not in str(e.value)
