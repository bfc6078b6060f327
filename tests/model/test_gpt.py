import math

import pytest
import torch
import torch.nn.functional as F

from mars.model.gpt import GPT, GPT_PRESETS, GPTConfig, count_params


def test_forward_shapes_and_loss(make_model):
    model = make_model()
    idx = torch.randint(0, 128, (3, 10))
    targets = torch.randint(0, 128, (3, 10))
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 10, 128)
    expected = F.cross_entropy(logits.reshape(-1, 128), targets.reshape(-1))
    torch.testing.assert_close(loss, expected)
    assert model(idx)[1] is None
    # targets of -1 are ignored
    masked = targets.clone()
    masked[:, :5] = -1
    _, loss_masked = model(idx, masked)
    torch.testing.assert_close(
        loss_masked, F.cross_entropy(logits[:, 5:].reshape(-1, 128), targets[:, 5:].reshape(-1))
    )


def test_initial_loss_is_uniform_entropy():
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=1024))
    _, loss = model(torch.randint(0, 1024, (4, 32)), torch.randint(0, 1024, (4, 32)))
    assert abs(loss.item() - math.log(1024)) < 0.05


def test_loss_is_fp32_under_bf16_autocast(make_model):
    model = make_model()
    targets = torch.randint(0, 128, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(torch.randint(0, 128, (2, 8)), targets)
    assert logits.dtype == torch.bfloat16
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, F.cross_entropy(logits.float().view(-1, 128), targets.view(-1)))


def test_sequence_longer_than_block_size_is_rejected(make_model):
    with pytest.raises(ValueError, match="block_size=16"):
        make_model()(torch.zeros(1, 17, dtype=torch.long))


def test_head_is_tied_to_token_embedding(make_model):
    model = make_model()
    assert model.lm_head.weight is model.transformer.wte.weight
    _, loss = model(torch.randint(0, 128, (2, 8)), torch.randint(0, 128, (2, 8)))
    loss.backward()
    # one gradient, holding both the embedding (only rows of seen tokens) and the head contributions
    grad = model.transformer.wte.weight.grad
    assert grad is model.lm_head.weight.grad
    assert (grad.abs().sum(dim=1) > 0).all()


def test_gpt2_initialisation():
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=4, n_head=4, n_embd=256, block_size=64, vocab_size=4096, bias=True)
    model = GPT(cfg)
    residual = 0.02 / math.sqrt(2 * cfg.n_layer)
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            assert p.std().item() == pytest.approx(residual, rel=0.03), name
        elif name.endswith((".bias",)):
            assert torch.count_nonzero(p) == 0, name
        elif "ln_" in name:
            assert torch.equal(p, torch.ones_like(p)), name
        else:  # wte (= lm_head), wpe, c_attn, c_fc
            assert p.std().item() == pytest.approx(0.02, rel=0.03), name
            assert abs(p.mean().item()) < 1e-3, name


def reference_attention(attn, x, layer_idx, scale_by_layer):
    """Causal self-attention written out by hand."""
    B, T, C = x.shape
    H = attn.n_head
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in attn.c_attn(x).split(C, dim=2))
    logits = q @ k.transpose(-2, -1) / math.sqrt(C // H)
    if scale_by_layer:
        logits = logits / (layer_idx + 1)
    logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (logits.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
    return attn.c_proj(y)


@pytest.mark.parametrize("scale_by_layer", [False, True])
def test_attention_matches_reference_with_layer_index_scaling(make_model, scale_by_layer):
    model = make_model(n_layer=3, scale_attn_by_inverse_layer_idx=scale_by_layer)
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        for i, block in enumerate(model.transformer.h):
            torch.testing.assert_close(block.attn(x), reference_attention(block.attn, x, i, scale_by_layer))


def test_layer_index_scaling_changes_attention_after_layer_0(make_model):
    torch.manual_seed(1)
    on = make_model(n_layer=3, scale_attn_by_inverse_layer_idx=True)
    off = make_model(n_layer=3, scale_attn_by_inverse_layer_idx=False)
    off.load_state_dict(on.state_dict())
    x = torch.randn(2, 12, 32) * 4
    with torch.no_grad():
        torch.testing.assert_close(on.transformer.h[0].attn(x), off.transformer.h[0].attn(x))
        for i in (1, 2):
            diff = (on.transformer.h[i].attn(x) - off.transformer.h[i].attn(x)).abs().max()
            assert diff > 1e-3, i


def test_bias_switch(make_model):
    with_bias = dict(make_model(bias=True).named_parameters())
    without = dict(make_model(bias=False).named_parameters())
    assert "transformer.h.0.attn.c_attn.bias" in with_bias and "transformer.ln_f.bias" in with_bias
    assert not any(name.endswith(".bias") for name in without)


def test_dropout_active_only_in_training(make_model):
    model = make_model(dropout=0.5)
    idx = torch.randint(0, 128, (2, 8))
    model.train()
    assert not torch.equal(model(idx)[0], model(idx)[0])
    model.eval()
    assert torch.equal(model(idx)[0], model(idx)[0])


# exact counts (tied head counted once); non-embedding leaves out wte and wpe
PRESET_PARAMS = {
    "gpt2_tiny": (3_148_032, 16_091_392),
    "gpt2_small": (84_953_856, 124_373_760),
    "gpt2_medium": (302_040_064, 354_599_936),
    "gpt2_large": (707_882_240, 773_582_080),
    "gpt2_xl": (1_474_715_200, 1_556_840_000),
}


@pytest.mark.parametrize("name", list(PRESET_PARAMS))
def test_preset_parameter_counts(name):
    cfg = GPT_PRESETS[name]
    with torch.device("meta"):
        model = GPT(cfg)
    assert (model.num_params(), model.num_params(non_embedding=False)) == PRESET_PARAMS[name]
    assert count_params(cfg) == model.num_params()
    assert count_params(cfg, non_embedding=False) == model.num_params(non_embedding=False)


def test_count_params_with_bias():
    cfg = GPTConfig(n_layer=3, n_head=2, n_embd=32, block_size=16, vocab_size=128, bias=True)
    model = GPT(cfg)
    assert count_params(cfg) == model.num_params()
    assert count_params(cfg, non_embedding=False) == model.num_params(non_embedding=False)


def test_empty_allocates_after_the_meta_hook_in_the_dtype_asked_with_the_head_tied():
    seen = []
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=128)
    model = GPT.empty(cfg, "cpu", dtype=torch.float64, on_meta=lambda m: seen.append(m.lm_head.weight.device))
    assert seen == [torch.device("meta")]  # the hook ran before any storage existed
    assert all(p.device.type == "cpu" and p.dtype == torch.float64 for p in model.parameters())
    assert model.lm_head.weight is model.transformer.wte.weight


def tanh_gelu(x):
    """GPT-2's GELU, written out: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def test_mlp_uses_gpt2s_tanh_gelu_by_default_and_the_exact_one_on_request():
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    small = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=128)
    tanh_mlp = GPT(GPTConfig(**small)).transformer.h[0].mlp
    exact_mlp = GPT(GPTConfig(**small, activation="gelu")).transformer.h[0].mlp
    exact = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    torch.testing.assert_close(tanh_mlp.gelu(x), tanh_gelu(x), rtol=0, atol=1e-15)
    torch.testing.assert_close(exact_mlp.gelu(x), exact, rtol=0, atol=1e-15)
    assert (tanh_mlp.gelu(x) - exact_mlp.gelu(x)).abs().max() > 1e-4  # the two are told apart
    with pytest.raises(ValueError, match="activation='relu' is not one of gelu_tanh, gelu"):
        GPT(GPTConfig(**small, activation="relu"))


def test_loss_of_a_float64_model_is_float64(make_model):
    model = make_model().double()
    targets = torch.randint(0, 128, (2, 8))
    logits, loss = model(torch.randint(0, 128, (2, 8)), targets)
    assert logits.dtype == loss.dtype == torch.float64
    torch.testing.assert_close(loss, F.cross_entropy(logits.view(-1, 128), targets.view(-1)), rtol=0, atol=0)


def test_model_json_from_before_the_activation_field_loads_as_exact_gelu(tmp_path, make_model):
    import json

    from mars.checkpoint import load_model
    from mars.checkpoint.model_dir import save_model
    from mars.errors import CheckpointError

    save_model(make_model(), tmp_path)
    cfg = json.loads((tmp_path / "model.json").read_text())
    assert cfg["activation"] == "gelu_tanh"
    del cfg["activation"]  # what every checkpoint written before the field holds: trained with exact GELU
    (tmp_path / "model.json").write_text(json.dumps(cfg))
    assert load_model(tmp_path)[0].config.activation == "gelu"
    (tmp_path / "model.json").write_text(json.dumps({**cfg, "activation": "swish"}))
    with pytest.raises(CheckpointError, match=r"model\.json: model\.activation='swish' is not one of"):
        load_model(tmp_path)


def test_a_run_from_before_the_activation_field_resumes_only_with_exact_gelu():
    # its config.yaml has no model.activation: it trained with the exact GELU, and continuing it with
    # the tanh default would change the function under its weights
    from mars.train.resume import fixed_differences

    saved = {"model": {"n_layer": 2, "n_head": 2, "n_embd": 32}, "train": {"seed": 1}}
    now = {"model": {"arch": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32}, "train": {"seed": 1}}
    tanh = fixed_differences(saved, {**now, "model": {**now["model"], "activation": "gelu_tanh"}}, 1, 1)
    assert tanh == ["model.activation: 'gelu' -> 'gelu_tanh'"]
    assert fixed_differences(saved, {**now, "model": {**now["model"], "activation": "gelu"}}, 1, 1) == []
