"""GPT-2 model configuration and the size presets (docs/algorithms.md section 6)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# The MLP activation. "gelu_tanh": GELU's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
# as in the original GPT-2, the reference runs (docs/algorithms.md section 6) and Hugging Face's
# "gelu_new". "gelu": the exact erf form, for models trained with it.
ACTIVATIONS = ("gelu_tanh", "gelu")


@dataclass
class GPTConfig:
    """Field names are the `model.*` config keys and GPT's constructor arguments."""

    arch: str = "gpt2"  # model.arch: the architecture (mars.model.spec)
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64
    bias: bool = False
    dropout: float = 0.0
    scale_attn_by_inverse_layer_idx: bool = True
    activation: str = "gelu_tanh"  # gelu_tanh (GPT-2's, the reference's) | gelu (exact erf)

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, GPTConfig] = {
    # a few million non-embedding parameters: CPU runs in minutes
    "gpt2_tiny": GPTConfig(n_layer=4, n_head=4, n_embd=256, block_size=256),
    "gpt2_small": GPTConfig(n_layer=12, n_head=12, n_embd=768),
    "gpt2_medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024),
    "gpt2_large": GPTConfig(n_layer=36, n_head=20, n_embd=1280),
    "gpt2_xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600),
}
