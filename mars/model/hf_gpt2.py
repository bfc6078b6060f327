"""Conversion between mars GPT and Hugging Face transformers' GPT2LMHeadModel (GPT-2's adapter;
mars.model.hf converts a model of any architecture through its adapter).

Mapping (our parameter names already match Hugging Face's):
- the four matmul weights of a block (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are
  nn.Linear (out, in) here and Conv1D (in, out) there: transposed;
- bias=False models get all-zero biases (Hugging Face's GPT-2 always has them), which computes
  the same function; importing takes bias=True iff some bias is non-zero or the config says so;
- vocabulary: the exported model holds every row of wte/lm_head that enters our softmax: all
  ``vocab_size`` (50304: GPT-2's 50257 tokens and the padding rows, which a run trains like any other
  and whose logits enter the softmax), or the first ``live_vocab_size`` of a model whose other rows
  are masked out; so its logits, softmax and loss are ours exactly. config.json keeps
  ``mars_vocab_size`` (50304): importing a model with fewer rows (an export of a masked model, or a
  transformers GPT-2 with its 50257) pads it to that many with zero rows and sets
  ``live_vocab_size`` to the rows it had, so the padding is masked out of the softmax and the model
  computes what it computed there (a zero row would have logit 0 and take probability from the
  real tokens);
- activation: our default tanh GELU (GPT-2's, config.activation "gelu_tanh") is exported as
  "gelu_new", the name GPT-2's own config uses; importing maps every Hugging Face spelling of the tanh
  form (gelu_new, gelu_pytorch_tanh, gelu_fast) to it, and the exact erf form ("gelu",
  "gelu_python") to config.activation "gelu", so an imported model computes what it computed there;
- LayerNorm eps 1e-5, scale_attn_by_inverse_layer_idx as configured, n_positions = block_size.

transformers applies scale_attn_by_inverse_layer_idx in its SDPA path only in recent releases
(huggingface/transformers#44380 / #44397); older ones silently drop it there and need
attn_implementation="eager". ``scale_is_honoured`` checks the installed one.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn

from mars.data.tokenizer import EOT_ID
from mars.model.gpt import GPT, GPTConfig
from mars.model.lm import unwrap_model

HF_MODEL_TYPE = "gpt2"
HF_ARCHITECTURE = "GPT2LMHeadModel"
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
WTE, LM_HEAD = "transformer.wte.weight", "lm_head.weight"
LAYER_NORM_EPS = 1e-5
# Hugging Face activation_function values of each of our activations (the first is what we export)
HF_ACTIVATIONS = {
    "gelu_tanh": ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"),
    "gelu": ("gelu", "gelu_python"),
}


def hf_config(config: GPTConfig, attn_implementation: str = "sdpa", tokenizer=None):
    """The transformers GPT2Config that computes what GPT(config) computes: its rows that enter the
    softmax (``tokenizer``, default GPT-2's: its end-of-text token)."""
    from transformers import GPT2Config

    eot = EOT_ID if tokenizer is None else tokenizer.eos_token_id
    vocab = config.live_vocab_size or config.vocab_size  # the rows that enter the softmax
    eot = eot if eot is not None and vocab > eot else None
    return GPT2Config(
        vocab_size=vocab,
        n_positions=config.block_size,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        n_inner=4 * config.n_embd,
        activation_function=HF_ACTIVATIONS[config.activation][0],
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.dropout,
        layer_norm_epsilon=LAYER_NORM_EPS,
        initializer_range=0.02,
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=config.scale_attn_by_inverse_layer_idx,
        reorder_and_upcast_attn=False,
        bos_token_id=eot,
        eos_token_id=eot,
        tie_word_embeddings=True,
        architectures=["GPT2LMHeadModel"],
        attn_implementation=attn_implementation,
        mars_bias=config.bias,  # not derivable from zero biases: kept for an exact round trip
        mars_vocab_size=config.vocab_size,
    )


def to_hf(model: nn.Module, attn_implementation: str = "sdpa", tokenizer=None):
    """A GPT2LMHeadModel (on the model's device and dtype, same train/eval mode) with our weights
    copied in: it shares no storage with ``model``."""
    from transformers import GPT2LMHeadModel

    gpt = unwrap_model(model)
    if not isinstance(gpt, GPT):
        raise TypeError(f"expected a mars GPT, got {type(gpt).__name__}")
    ours = gpt.state_dict()
    config = hf_config(gpt.config, attn_implementation, tokenizer)
    with torch.device("meta"):
        hf = GPT2LMHeadModel(config)
    tensors = {}
    for key, ref in hf.state_dict().items():
        if key == LM_HEAD:
            continue
        if key in ours:
            t = ours[key]
            if key == WTE:
                t = t[: config.vocab_size]
            elif key.endswith(CONV1D_WEIGHTS):
                t = t.t()
            tensors[key] = t.detach().clone(memory_format=torch.contiguous_format)
        elif key.endswith(".bias") and not gpt.config.bias:
            tensors[key] = torch.zeros(ref.shape, dtype=ours[WTE].dtype, device=ours[WTE].device)
        else:
            raise KeyError(f"no mars GPT parameter maps to Hugging Face's {key}")
        if tensors[key].shape != ref.shape:
            raise ValueError(
                f"{key}: shape {tuple(tensors[key].shape)}, Hugging Face expects {tuple(ref.shape)}"
            )
    tensors[LM_HEAD] = tensors[WTE]
    hf.load_state_dict(tensors, strict=True, assign=True)
    hf.tie_weights()
    return hf.train(gpt.training)


def is_bias(name: str) -> bool:
    """A bias parameter of GPT-2's weights, not the attention-mask buffers that older checkpoints store
    as ``attn.bias`` and ``attn.masked_bias``."""
    parts = name.split(".")
    return parts[-1] == "bias" and parts[-2:-1] != ["attn"]


def config_from_hf(hc, bias_nonzero: Callable[[], bool]) -> GPTConfig:
    """Our GPTConfig for a transformers GPT2Config (ValueError naming what we cannot import).
    ``bias_nonzero()``: whether some bias of the weights is non-zero (asked only when config.json does
    not say), so a directory can be checked without loading its model."""
    problems = []
    if hc.n_inner not in (None, 4 * hc.n_embd):
        problems.append(f"n_inner={hc.n_inner} (we use 4 * n_embd = {4 * hc.n_embd})")
    if not hc.scale_attn_weights:
        problems.append("scale_attn_weights=False")
    if abs(hc.layer_norm_epsilon - LAYER_NORM_EPS) > 1e-12:
        problems.append(f"layer_norm_epsilon={hc.layer_norm_epsilon} (we use {LAYER_NORM_EPS})")
    if getattr(hc, "add_cross_attention", False):
        problems.append("add_cross_attention=True")
    activation = next((ours for ours, hf in HF_ACTIVATIONS.items() if hc.activation_function in hf), None)
    if activation is None:
        known = ", ".join(name for names in HF_ACTIVATIONS.values() for name in names)
        problems.append(f"activation_function={hc.activation_function!r} (we take {known})")
    if problems:
        raise ValueError("cannot import this GPT-2 into mars GPT: " + "; ".join(problems))
    vocab = getattr(hc, "mars_vocab_size", None) or -(-hc.vocab_size // 64) * 64
    if vocab < hc.vocab_size:
        raise ValueError(f"mars_vocab_size={vocab} is smaller than vocab_size={hc.vocab_size}")
    return GPTConfig(
        n_layer=hc.n_layer,
        n_head=hc.n_head,
        n_embd=hc.n_embd,
        block_size=hc.n_positions,
        vocab_size=vocab,
        live_vocab_size=hc.vocab_size if hc.vocab_size < vocab else None,  # the padding: out of the softmax
        bias=bool(getattr(hc, "mars_bias", False)) or bias_nonzero(),
        dropout=hc.resid_pdrop,
        scale_attn_by_inverse_layer_idx=bool(hc.scale_attn_by_inverse_layer_idx),
        activation=activation,
    )


def from_hf(hf_model) -> GPT:
    """Our GPT with the weights of a GPT2LMHeadModel (same device, dtype and train/eval mode)."""
    hc = hf_model.config
    theirs = hf_model.state_dict()
    config = config_from_hf(hc, lambda: any(bool(v.any()) for k, v in theirs.items() if is_bias(k)))
    vocab = config.vocab_size
    ref_param = theirs[WTE]
    model = GPT.empty(config, ref_param.device, dtype=ref_param.dtype)
    tensors = {}
    for key in model.state_dict():
        if key == LM_HEAD:
            continue
        t = theirs[key]
        if key == WTE:
            t = torch.cat([t, t.new_zeros(vocab - hc.vocab_size, hc.n_embd)])
        elif key.endswith(CONV1D_WEIGHTS):
            t = t.t()
        tensors[key] = t
    tensors[LM_HEAD] = tensors[WTE]
    model.load_state_dict(tensors, strict=True)
    return model.train(hf_model.training)


@functools.cache
def scale_is_honoured(attn_implementation: str = "sdpa") -> bool:
    """Whether the installed transformers' GPT-2 applies scale_attn_by_inverse_layer_idx with this
    attention implementation (checked numerically on a 2-layer model; global RNG state untouched)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    def config(scaled: bool):
        return GPT2Config(
            vocab_size=32, n_positions=8, n_embd=16, n_layer=2, n_head=2, bos_token_id=None,
            eos_token_id=None, scale_attn_by_inverse_layer_idx=scaled,
            attn_implementation=attn_implementation,
        )  # fmt: skip

    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(0)
        plain, scaled = GPT2LMHeadModel(config(False)).eval(), GPT2LMHeadModel(config(True)).eval()
        scaled.load_state_dict(plain.state_dict())
        idx = torch.arange(8)[None]
        return not torch.equal(plain(idx).logits, scaled(idx).logits)


def finish_export(out_dir: str | Path, model: GPT) -> None:
    """After save_pretrained: warn when the installed transformers would ignore the model's
    scale_attn_by_inverse_layer_idx under SDPA attention."""
    if model.config.scale_attn_by_inverse_layer_idx and not scale_is_honoured("sdpa"):
        warnings.warn(
            "this transformers version ignores scale_attn_by_inverse_layer_idx under SDPA: load the "
            "export with attn_implementation='eager'",
            stacklevel=3,
        )
