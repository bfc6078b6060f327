import pytest
import torch

from mars.model import flops
from mars.model.flops import PEAK_FLOPS_ENV, mfu, peak_flops
from mars.model.gpt import GPT_PRESETS, count_params, flops_per_token


def test_gpt2_small_flops_per_token():
    cfg = GPT_PRESETS["gpt2_small"]
    # 6 * (blocks 12 * 12 * 768^2 + lm_head 768 * 50304) + attention 12 * 12 * 768 * 1024
    assert flops_per_token(cfg) == 6 * (12 * 12 * 768**2 + 768 * 50304) + 12 * 12 * 768 * 1024
    # ~ 6 x 124M parameters + ~113M for attention (wpe lookups and LayerNorms are not matmuls)
    six_n = 6 * count_params(cfg, non_embedding=False)
    assert flops_per_token(cfg) == pytest.approx(six_n + 113_246_208, rel=0.01)
    assert flops_per_token(cfg) / 1e9 == pytest.approx(0.855, abs=0.001)


def test_attention_term_grows_with_sequence_length():
    cfg = GPT_PRESETS["gpt2_medium"]
    delta = flops_per_token(cfg, seq_len=2048) - flops_per_token(cfg, seq_len=1024)
    assert delta == 12 * cfg.n_layer * cfg.n_embd * 1024
    assert flops_per_token(cfg) == flops_per_token(cfg, seq_len=cfg.block_size)


def test_presets_flops_increase_with_size():
    values = [
        flops_per_token(GPT_PRESETS[n])
        for n in ("gpt2_tiny", "gpt2_small", "gpt2_medium", "gpt2_large", "gpt2_xl")
    ]
    assert values == sorted(values)


def test_no_peak_and_no_mfu_on_cpu(monkeypatch):
    monkeypatch.delenv(PEAK_FLOPS_ENV, raising=False)
    assert peak_flops("cpu") is None
    assert peak_flops(None) is None
    assert mfu(1e5, 1e9, "cpu") is None


def test_peak_override_by_argument_and_env(monkeypatch):
    monkeypatch.setenv(PEAK_FLOPS_ENV, "100e12")
    assert peak_flops("cpu") == 100e12
    assert peak_flops("cpu", override=5e12) == 5e12
    # 2 devices, 1e5 tokens/s in total at 1e9 FLOPs/token = 1e14 FLOP/s of 2 x 100e12
    assert mfu(1e5, 1e9, "cpu", num_devices=2) == pytest.approx(0.5)
    assert mfu(1e5, 1e9, "cpu", peak=1e15) == pytest.approx(0.1)
    monkeypatch.setenv(PEAK_FLOPS_ENV, "fast")
    with pytest.raises(ValueError, match="MARS_PEAK_FLOPS='fast'"):
        peak_flops("cpu")


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA GeForce RTX 3090", None),
    ],
)
def test_peak_from_cuda_device_name(monkeypatch, name, peak):
    monkeypatch.delenv(PEAK_FLOPS_ENV, raising=False)
    monkeypatch.setattr(flops.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(flops.torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda", 0)) == peak
    assert peak_flops("cuda") == peak
