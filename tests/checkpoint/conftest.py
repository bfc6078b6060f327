import pytest
import torch

from mars.model.config import GPTConfig
from mars.model.gpt import GPT


@pytest.fixture
def make_model():
    """GPT factory; every parameter (biases and LayerNorms included) randomised, so a mapping
    that drops or mixes up any tensor shows up in the outputs."""

    def make(**overrides) -> GPT:
        cfg = GPTConfig(**{"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 128,
                           **overrides})  # fmt: skip
        model = GPT(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(".bias") or "ln_" in name:
                    p.add_(torch.randn_like(p) * 0.1)
        return model.eval()

    return make
