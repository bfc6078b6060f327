"""GPT-2 (`model.arch=gpt2`) with the options of the reference runs (docs/algorithms.md section 6): its
config and size presets, the model, its parameter and FLOPs counts, and its spec.

Parameter names follow nanoGPT (and therefore Hugging Face's GPT2LMHeadModel):
``transformer.wte``, ``transformer.wpe``, ``transformer.h.{i}.{ln_1,attn.c_attn,attn.c_proj,ln_2,
mlp.c_fc,mlp.c_proj}``, ``transformer.ln_f`` and ``lm_head`` (the same tensor as ``wte``).
The MLP's GELU is GPT-2's tanh approximation unless ``config.activation`` says "gelu" (exact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from mars.checks import at_least, choice, fraction, multiple_of
from mars.model import mup
from mars.model.lm import CausalLM, normal_, token_loss
from mars.model.spec import ModelSpec, register_arch, roles_by_name

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
    # the vocabulary rows that enter the softmax (null: all vocab_size). Set by train.init_from of a model
    # with fewer rows (a transformers GPT-2's 50257): the rows it lacks are masked out of the softmax, so
    # the model computes what it computed there (docs/models.md, "Padded vocabulary rows")
    live_vocab_size: int | None = None
    bias: bool = False
    dropout: float = 0.0
    scale_attn_by_inverse_layer_idx: bool = True
    activation: str = "gelu_tanh"  # gelu_tanh (GPT-2's, the reference's) | gelu (exact erf)
    parametrization: str = "sp"  # sp | mup (mars.model.mup, docs/mup.md)
    mup_base_width: int | None = None  # mup: the width the hyperparameters were tuned at


GPT_PRESETS: dict[str, GPTConfig] = {
    # a few million non-embedding parameters: CPU runs in minutes
    "gpt2_tiny": GPTConfig(n_layer=4, n_head=4, n_embd=256, block_size=256),
    "gpt2_small": GPTConfig(n_layer=12, n_head=12, n_embd=768),
    "gpt2_medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024),
    "gpt2_large": GPTConfig(n_layer=36, n_head=20, n_embd=1280),
    "gpt2_xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600),
}


def validate_config(c: GPTConfig) -> None:
    """One ValueError per value that cannot build a GPT, naming the key."""
    for key in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
        at_least(f"model.{key}", getattr(c, key), 1)
    multiple_of("model.n_embd", c.n_embd, "model.n_head", c.n_head)
    if c.live_vocab_size is not None and not 1 <= c.live_vocab_size <= c.vocab_size:
        raise ValueError(
            f"model.live_vocab_size={c.live_vocab_size} must lie in [1, model.vocab_size={c.vocab_size}] "
            "(or be null: every row enters the softmax)"
        )
    fraction("model.dropout", c.dropout)
    choice("model.activation", c.activation, ACTIVATIONS)
    mup.check(c)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        # softmax(q k^T * scale / layer_div): scale the usual 1/sqrt(head_dim), layer_div = layer_idx + 1
        # when scale_attn_by_inverse_layer_idx is on (q is divided by it; an integer, exact in any dtype).
        # layer_div is a buffer, not a Python number: torch.compile takes it as an input, so every block
        # shares one compilation (a number would be a constant it guards on, one recompile per layer).
        # The scale is one number for all blocks: 1/sqrt(head_dim), or muP's sqrt(base head_dim)/head_dim.
        self.scale = mup.attention_scale(config) or (config.n_embd // config.n_head) ** -0.5
        self.by_layer = config.scale_attn_by_inverse_layer_idx
        self.register_buffer("layer_div", torch.tensor(float(layer_idx + 1)), persistent=False)
        self.layer_idx = layer_idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.by_layer:
            q = q / self.layer_div
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True, scale=self.scale
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        # gelu_tanh: GPT-2's tanh approximation (Hugging Face "gelu_new"); gelu: the exact erf form
        self.gelu = nn.GELU(approximate="tanh" if config.activation == "gelu_tanh" else "none")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(CausalLM):
    def __init__(self, config: GPTConfig):
        super().__init__()
        validate_config(config)
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.output_mult = mup.output_multiplier(config)  # muP's 1/m on the logits; 1.0 under SP
        self.tie_weights()
        self.init_weights()

    def tie_weights(self) -> None:
        """Make lm_head use the token embedding matrix (call again after ``to_empty``)."""
        self.lm_head.weight = self.transformer.wte.weight

    def materialised(self) -> None:
        """After ``to_empty``: tie the weights again, set each block's attention divisor."""
        self.tie_weights()
        for block in self.transformer.h:
            block.attn.layer_div.fill_(block.attn.layer_idx + 1)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 initialisation: N(0, 0.02) weights, zero biases, unit LayerNorms, and the residual
        projections (attn.c_proj, mlp.c_proj) at 0.02 / sqrt(2 * n_layer); under muP the block matrices'
        std divided by sqrt(their fan-in over the base model's) (mars.model.mup).

        With a `generator`, the weights are a function of its seed alone: every matrix is drawn whole,
        in a fixed order, and a sharded (FSDP2 DTensor) parameter keeps its own slice, so the same seed
        gives the same model whether it is replicated (DDP) or sharded over any number of ranks."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        factor = mup.init_factors(self)  # {} under SP
        for name, module in self.named_modules():
            if module is self.lm_head:
                continue  # shares its weight with wte, drawn once below as an Embedding
            if isinstance(module, nn.Linear):
                std = (residual_std if name.endswith("c_proj") else 0.02) * factor.get(f"{name}.weight", 1.0)
                normal_(module.weight, std, generator)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                normal_(module.weight, 0.02, generator)
            elif isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                if module.bias is not None:
                    module.bias.zero_()

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count, the tied wte/lm_head matrix counted once. ``non_embedding`` leaves out
        the token (wte, shared with lm_head) and position (wpe) embeddings."""
        n = sum(p.numel() for p in self.parameters())  # parameters() yields a shared tensor once
        if non_embedding:
            n -= self.transformer.wte.weight.numel() + self.transformer.wpe.weight.numel()
        return n

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx, targets: int64 (B, T) token ids, T <= block_size; targets of -1 are ignored.
        Returns the logits (B, T, vocab_size) for every position, and the mean token
        cross-entropy computed in fp32, or fp64 for a float64 model (None without targets). With
        config.live_vocab_size, the logits of the rows beyond it are -inf: out of the softmax."""
        self.check_length(idx)
        pos = torch.arange(idx.shape[1], dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if self.output_mult != 1.0:  # muP: logits x 1/m, applied to the n_embd-wide input of the head
            x = x * self.output_mult
        logits = self.lm_head(x)
        live = self.config.live_vocab_size
        if live is not None and live < self.config.vocab_size:  # (lm_head's backward needs not its output)
            logits[..., live:] = float("-inf")
        return logits, None if targets is None else token_loss(logits, targets)

    def fold_multipliers(self, state: dict, attn: float, out: float) -> None:
        """mars.model.mup.as_sp: fold the attention factor into q's rows of c_attn, the output multiplier
        into ln_f, in a state dict of this model."""
        C = self.config.n_embd
        for i in range(self.config.n_layer):
            for kind in ("weight", "bias"):
                key = f"transformer.h.{i}.attn.c_attn.{kind}"
                if key in state:
                    state[key][:C] *= attn
        for kind in ("weight", "bias"):
            if f"transformer.ln_f.{kind}" in state:
                state[f"transformer.ln_f.{kind}"] *= out


# ----------------------------------------------------------------------------- counts and FLOPs


def block_params(cfg: GPTConfig) -> int:
    """Parameters of one transformer block (weights, plus biases and LayerNorm shifts if bias)."""
    C, b = cfg.n_embd, int(cfg.bias)
    attn = C * 3 * C + b * 3 * C + C * C + b * C
    mlp = C * 4 * C + b * 4 * C + 4 * C * C + b * C
    norms = 2 * (C + b * C)
    return attn + mlp + norms


def count_params(cfg: GPTConfig, non_embedding: bool = True) -> int:
    """GPT(cfg).num_params(non_embedding) without building the model."""
    n = cfg.n_layer * block_params(cfg) + cfg.n_embd * (1 + int(cfg.bias))  # blocks + ln_f
    if not non_embedding:
        n += cfg.vocab_size * cfg.n_embd + cfg.block_size * cfg.n_embd  # wte (= lm_head) + wpe
    return n


def flops_per_token(cfg: GPTConfig, seq_len: int | None = None) -> float:
    """Training (forward + backward) FLOPs per token at sequence length seq_len (default block_size),
    in mars.model.flops' convention: 6 x (the blocks' weights + the lm_head matrix; the embedding
    lookups are not matmuls) + 12 x n_layer x n_embd x T for the attention scores and the weighted
    values."""
    T = cfg.block_size if seq_len is None else seq_len
    C = cfg.n_embd
    n_matmul = cfg.n_layer * 12 * C * C + C * cfg.vocab_size  # qkv 3C^2, proj C^2, mlp 8C^2; lm_head
    return float(6 * n_matmul + 12 * cfg.n_layer * C * T)


# the presets, by (n_layer, n_head, n_embd), for report labels
GPT_SIZES = {(4, 4, 256): "tiny", (12, 12, 768): "small", (24, 16, 1024): "medium", (36, 20, 1280): "large",
             (48, 25, 1600): "xl"}  # fmt: skip

register_arch(
    ModelSpec(
        name="gpt2",
        title="GPT-2",
        config=GPTConfig,
        model=GPT,
        blocks=lambda model: model.transformer.h,
        flops_per_token=flops_per_token,
        count_params=count_params,
        param_roles=lambda model: roles_by_name(
            model,
            embeddings=("transformer.wte.weight", "transformer.wpe.weight"),
            heads=("lm_head.weight",),
        ),
        tied=lambda config: {"lm_head.weight": "transformer.wte.weight"},
        shape_keys=("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "bias"),
        fixed_keys=("scale_attn_by_inverse_layer_idx", "activation", "parametrization", "mup_base_width"),
        required_keys=(
            "n_layer",
            "n_head",
            "n_embd",
            "block_size",
            "vocab_size",
            "bias",
            "dropout",
            "scale_attn_by_inverse_layer_idx",
        ),  # fmt: skip
        legacy_values={"activation": "gelu"},  # model.json / run configs written before the field
        validate=validate_config,
        sizes=GPT_SIZES,
        hf_adapter="mars.model.hf_gpt2",
    )
)
