"""LLaMA-style decoder (`model.arch=llama`): pre-norm RMSNorm, rotary positions, SwiGLU, grouped-query
attention, no biases; the token embedding tied to the output head or not (docs/llama.md).

Parameter names are those of Hugging Face's ``LlamaForCausalLM`` (``model.embed_tokens``,
``model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
mlp.{gate,up,down}_proj}``, ``model.norm``, ``lm_head``), and the rotary layout is its
``rotate_half`` one (dimension j of a head pairs with j + head_dim/2), so export and import are a
copy (mars.model.hf_llama). q, k and v are separate matrices: Newton-Schulz orthogonalises each,
and the per-matrix scale of Moonlight / MARS-M sees each shape.

The rotary tables are float32 buffers computed from real cos/sin (never complex), not saved in
checkpoints (non-persistent), and recomputed whenever the model is materialised (``empty``, after
FSDP2's ``to_empty``) or finds them cast away from float32 (``model.to(torch.bfloat16)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from mars.checks import above, at_least, multiple_of
from mars.model import mup
from mars.model.lm import CausalLM, normal_, token_loss
from mars.model.spec import ModelSpec, register_arch, roles_by_name


@dataclass
class LlamaConfig:
    """Field names are the `model.*` config keys (shared with GPT-2 where they mean the same)."""

    arch: str = "llama"
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int | None = None  # key/value heads (grouped-query attention); None: n_head (plain MHA)
    n_embd: int = 768
    block_size: int = 512
    vocab_size: int = 50304  # GPT-2's 50257 padded to a multiple of 64
    mlp_hidden: int | None = None  # SwiGLU width; None: 8/3 x n_embd rounded up to a multiple of multiple_of
    multiple_of: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True  # lm_head uses the token embedding matrix
    parametrization: str = "sp"  # sp | mup (mars.model.mup, docs/mup.md)
    mup_base_width: int | None = None  # mup: the width the hyperparameters were tuned at


def kv_heads(c: Any) -> int:
    return c.n_head if c.n_kv_head is None else c.n_kv_head


def head_dim(c: Any) -> int:
    return c.n_embd // c.n_head


def mlp_hidden(c: Any) -> int:
    """The SwiGLU hidden size: explicit, or LLaMA's rule int(2/3 * 4 * n_embd) rounded up to multiple_of."""
    if c.mlp_hidden is not None:
        return c.mlp_hidden
    hidden = int(2 * 4 * c.n_embd / 3)
    return c.multiple_of * math.ceil(hidden / c.multiple_of)


def validate_config(c: LlamaConfig) -> None:
    """One ValueError per value that cannot build the model, naming the key and the fix."""
    for key in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "multiple_of"):
        at_least(f"model.{key}", getattr(c, key), 1)
    multiple_of("model.n_embd", c.n_embd, "model.n_head", c.n_head)
    if head_dim(c) % 2:
        raise ValueError(
            f"model.n_embd / model.n_head = {c.n_embd} / {c.n_head} = {head_dim(c)} is odd: rotary "
            "embeddings rotate pairs of dimensions; choose an even head size"
        )
    if c.n_kv_head is not None and (c.n_kv_head < 1 or c.n_head % c.n_kv_head):
        raise ValueError(
            f"model.n_kv_head={c.n_kv_head} must divide model.n_head={c.n_head} (each key/value head serves "
            "n_head / n_kv_head query heads); choose a divisor, or null for n_head"
        )
    if c.mlp_hidden is not None and c.mlp_hidden < 1:
        raise ValueError(
            f"model.mlp_hidden={c.mlp_hidden} must be positive: set the SwiGLU width, or null for the "
            "8/3 rule"
        )
    above("model.norm_eps", c.norm_eps)
    above("model.rope_theta", c.rope_theta)
    mup.check(c)
    if mup.is_mup(c):
        if c.mlp_hidden is not None:
            raise ValueError(
                f"model.mlp_hidden={c.mlp_hidden} is fixed, but under model.parametrization=mup the SwiGLU "
                "width must grow with n_embd (its matrices are muP's hidden matrices); set "
                "model.mlp_hidden=null (the 8/3 rule)"
            )
        if (c.mup_base_width // c.n_head) % 2:
            raise ValueError(
                f"model.mup_base_width={c.mup_base_width} gives the base model an odd head size "
                f"{c.mup_base_width // c.n_head} (rotary embeddings rotate pairs); choose a multiple of "
                f"{2 * c.n_head}"
            )


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 (as LLaMA and transformers do), cast back to x's dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_tables(c: Any, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), float32 (block_size, head_dim): angle t * theta^(-2i/d) for pair i, in both halves."""
    d = head_dim(c)
    inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    t = torch.arange(c.block_size, dtype=torch.float32, device=device)
    freqs = torch.outer(t, inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, heads, T, d); cos, sin: (T, d) float32, cast to x's dtype at use."""
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = c.n_head, kv_heads(c), head_dim(c)
        # None: SDPA's 1/sqrt(head_dim); muP: sqrt(base head_dim)/head_dim, one number for every block
        self.scale = mup.attention_scale(c)
        self.q_proj = nn.Linear(c.n_embd, c.n_head * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(c.n_head * self.head_dim, c.n_embd, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # key/value head j serves query heads j * g .. (j + 1) * g - 1 (g = n_head / n_kv_head)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=self.scale, enable_gqa=self.n_kv_head != self.n_head
        )
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        hidden = mlp_hidden(c)
        self.gate_proj = nn.Linear(c.n_embd, hidden, bias=False)
        self.up_proj = nn.Linear(c.n_embd, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, c.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.n_embd, c.norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.n_embd, c.norm_eps)
        self.mlp = MLP(c)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


RESIDUAL_PROJECTIONS = ("self_attn.o_proj", "mlp.down_proj")
MUP_KEYS = ("parametrization", "mup_base_width")  # added later: a model.json without them is SP


class Llama(CausalLM):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        validate_config(config)
        self.config = config
        self.model = nn.ModuleDict(
            dict(
                embed_tokens=nn.Embedding(config.vocab_size, config.n_embd),
                layers=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                norm=RMSNorm(config.n_embd, config.norm_eps),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.output_mult = mup.output_multiplier(config)  # muP's 1/m on the logits; 1.0 under SP
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.tie_weights()
        self.reset_rope()
        self.init_weights()

    def materialised(self) -> None:
        """After ``to_empty`` (``empty``): tie the weights again, compute the rotary tables in float32."""
        self.tie_weights()
        self.reset_rope()

    def tie_weights(self) -> None:
        """With tie_embeddings, make lm_head use the token embedding matrix (again after ``to_empty``)."""
        if self.config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def reset_rope(self) -> None:
        """Compute the float32 rotary tables on the buffers' device (meta stays meta)."""
        self.rope_cos, self.rope_sin = rope_tables(self.config, self.rope_cos.device)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """N(0, 0.02) matrices and embeddings, the residual projections (o_proj, down_proj) at
        0.02 / sqrt(2 * n_layer), unit RMSNorm gains; under muP the block matrices' std divided by
        sqrt(their fan-in over the base model's) (mars.model.mup). Each tensor is drawn whole from
        ``generator`` in a fixed order, so replicated and sharded (FSDP2) models of one seed are the same
        model."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        factor = mup.init_factors(self)  # {} under SP
        for name, module in self.named_modules():
            if module is self.lm_head and self.config.tie_embeddings:
                continue  # the embedding matrix, drawn once as an Embedding
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith(RESIDUAL_PROJECTIONS) else 0.02
                normal_(module.weight, std * factor.get(f"{name}.weight", 1.0), generator)
            elif isinstance(module, nn.Embedding):
                normal_(module.weight, 0.02, generator)
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count, a tied matrix once. ``non_embedding`` leaves out the vocabulary matrices
        (the token embedding and an untied output head)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.model.embed_tokens.weight.numel()
            if not self.config.tie_embeddings:
                n -= self.lm_head.weight.numel()
        return n

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx, targets: int64 (B, T) token ids, T <= block_size; targets of -1 are ignored. Returns the
        logits (B, T, vocab_size) and the mean token cross-entropy in fp32, or fp64 for a float64 model
        (None without targets)."""
        self.check_length(idx)
        T = idx.shape[1]
        if self.rope_cos.dtype != torch.float32:  # the model was cast (e.g. .to(bfloat16)): recompute
            self.reset_rope()
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.model.embed_tokens(idx)
        for block in self.model.layers:
            x = block(x, cos, sin)
        x = self.model.norm(x)
        if self.output_mult != 1.0:  # muP: logits x 1/m, applied to the n_embd-wide input of the head
            x = x * self.output_mult
        logits = self.lm_head(x)
        return logits, None if targets is None else token_loss(logits, targets)

    def fold_multipliers(self, state: dict, attn: float, out: float) -> None:
        """mars.model.mup.as_sp: fold the attention factor into q_proj (rotary embeddings are linear in q),
        the output multiplier into the final RMSNorm's gain, in a state dict of this model."""
        for i in range(self.config.n_layer):
            state[f"model.layers.{i}.self_attn.q_proj.weight"] *= attn
        state["model.norm.weight"] *= out


# ----------------------------------------------------------------------------- counts and FLOPs


def block_params(c: Any) -> int:
    C, kv = c.n_embd, kv_heads(c) * head_dim(c)
    return 2 * C * C + 2 * C * kv + 3 * C * mlp_hidden(c) + 2 * C  # q, o; k, v; gate, up, down; 2 norms


def count_params(c: Any, non_embedding: bool = True) -> int:
    """Llama(c).num_params(non_embedding) without building the model."""
    n = c.n_layer * block_params(c) + c.n_embd
    if not non_embedding:
        n += c.vocab_size * c.n_embd * (1 if c.tie_embeddings else 2)
    return n


def flops_per_token(c: Any, seq_len: int | None = None) -> float:
    """Training FLOPs per token (mars.model.flops' convention): 6 x the matmul weights (blocks and the
    output head) + 12 x n_layer x n_embd x T for the attention scores and the weighted values."""
    T = c.block_size if seq_len is None else seq_len
    C, kv = c.n_embd, kv_heads(c) * head_dim(c)
    n_matmul = c.n_layer * (2 * C * C + 2 * C * kv + 3 * C * mlp_hidden(c)) + C * c.vocab_size
    return float(6 * n_matmul + 12 * c.n_layer * C * T)


# the presets of configs/model/llama_*.yaml, by (n_layer, n_head, n_embd), for report labels
LLAMA_SIZES = {(4, 4, 256): "tiny", (12, 12, 768): "124m", (24, 12, 768): "210m", (12, 16, 2048): "720m",
               (32, 24, 1536): "1.2b"}  # fmt: skip

register_arch(
    ModelSpec(
        name="llama",
        title="LLaMA",
        config=LlamaConfig,
        model=Llama,
        blocks=lambda model: model.model.layers,
        flops_per_token=flops_per_token,
        count_params=count_params,
        param_roles=lambda model: roles_by_name(
            model, embeddings=("model.embed_tokens.weight",), heads=("lm_head.weight",)
        ),
        tied=lambda c: {"lm_head.weight": "model.embed_tokens.weight"} if c.tie_embeddings else {},
        shape_keys=(
            "n_layer",
            "n_head",
            "n_kv_head",
            "n_embd",
            "block_size",
            "vocab_size",
            "mlp_hidden",
            "multiple_of",
            "tie_embeddings",
        ),  # fmt: skip
        fixed_keys=("norm_eps", "rope_theta", "parametrization", "mup_base_width"),
        required_keys=tuple(f for f in LlamaConfig.__dataclass_fields__ if f not in ("arch", *MUP_KEYS)),
        validate=validate_config,
        sizes=LLAMA_SIZES,
        hf_adapter="mars.model.hf_llama",
    )
)
