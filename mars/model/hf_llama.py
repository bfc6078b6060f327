"""Conversion between mars Llama and Hugging Face transformers' LlamaForCausalLM.

A copy both ways: the parameter names are the same, and so is the rotary layout (rotate_half:
dimension j of a head pairs with j + head_dim/2), so no q/k row permutation is needed. The
config maps n_embd -> hidden_size, mlp_hidden -> intermediate_size, n_kv_head ->
num_key_value_heads, norm_eps -> rms_norm_eps, block_size -> max_position_embeddings,
tie_embeddings -> tie_word_embeddings, hidden_act "silu", no biases; the whole (padded)
vocabulary is exported, so logits agree on every id. rope theta is written under both spellings
(transformers 5.x reads ``rope_parameters``, 4.x ``rope_theta``: ``finish_export``), and
``mars_config`` keeps our config (e.g. the SwiGLU rule) for an exact round trip.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from mars.files import write_atomic
from mars.model.llama import Llama, LlamaConfig, head_dim, kv_heads, mlp_hidden
from mars.model.lm import unwrap_model

HF_MODEL_TYPE = "llama"
HF_ARCHITECTURE = "LlamaForCausalLM"


def hf_config(c: LlamaConfig, attn_implementation: str = "sdpa", eos_token_id: int | None = None):
    """The transformers LlamaConfig that computes what Llama(c) computes."""
    from transformers import LlamaConfig as HFLlamaConfig

    return HFLlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.n_embd,
        intermediate_size=mlp_hidden(c),
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        num_key_value_heads=kv_heads(c),
        head_dim=head_dim(c),
        hidden_act="silu",
        max_position_embeddings=c.block_size,
        rms_norm_eps=c.norm_eps,
        rope_theta=c.rope_theta,
        tie_word_embeddings=c.tie_embeddings,
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        initializer_range=0.02,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=None,
        architectures=[HF_ARCHITECTURE],
        attn_implementation=attn_implementation,
        mars_config=dataclasses.asdict(
            c
        ),  # our config, for an exact round trip (checked against the rest on import)
    )


def to_hf(model: nn.Module, attn_implementation: str = "sdpa", tokenizer=None):
    """A LlamaForCausalLM (on the model's device and dtype, same train/eval mode) holding a copy of our
    weights; its bos/eos ids are ``tokenizer``'s end-of-text token (default GPT-2's <|endoftext|>)."""
    from transformers import LlamaForCausalLM

    from mars.data.tokenizer import EOT_ID

    ours = unwrap_model(model)
    if not isinstance(ours, Llama):
        raise TypeError(f"expected a mars Llama, got {type(ours).__name__}")
    eos_token_id = EOT_ID if tokenizer is None else tokenizer.eos_token_id
    if eos_token_id is not None and eos_token_id >= ours.config.vocab_size:
        eos_token_id = None
    config = hf_config(ours.config, attn_implementation, eos_token_id)
    with torch.device("meta"):
        hf = LlamaForCausalLM(config)
    state = ours.state_dict()
    expected = hf.state_dict()
    if set(state) != set(expected):
        raise KeyError(f"names differ: ours only {sorted(set(state) - set(expected))[:3]}, "
                       f"theirs only {sorted(set(expected) - set(state))[:3]}")  # fmt: skip
    tensors = {}
    for key, ref in expected.items():
        if tuple(state[key].shape) != tuple(ref.shape):
            raise ValueError(
                f"{key}: shape {tuple(state[key].shape)}, Hugging Face expects {tuple(ref.shape)}"
            )
        tensors[key] = state[key].detach().clone(memory_format=torch.contiguous_format)
    if ours.config.tie_embeddings:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    hf.load_state_dict(tensors, strict=True, assign=True)
    hf.tie_weights()
    # the rotary inverse frequencies are non-persistent buffers, still on the meta device: rebuild them
    with torch.device(state["model.embed_tokens.weight"].device):
        hf.model.rotary_emb = type(hf.model.rotary_emb)(hf.config)
    return hf.train(ours.training)


def rope_theta(hc: Any) -> float:
    """The rope theta of a transformers LlamaConfig, 5.x (rope_parameters) or 4.x (rope_theta)."""
    params = getattr(hc, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(hc, "rope_theta", None))
    return 10000.0 if theta is None else float(theta)


def config_from_hf(hc, bias_nonzero: Callable[[], bool] | None = None) -> LlamaConfig:
    """Our LlamaConfig for a transformers LlamaConfig (ValueError naming what we cannot import); the
    config alone tells (``bias_nonzero`` is not asked: biases are refused by the config's flags)."""
    params = getattr(hc, "rope_parameters", None) or getattr(hc, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    problems = []
    if hc.hidden_act != "silu":
        problems.append(f"hidden_act={hc.hidden_act!r} (we use 'silu')")
    if getattr(hc, "attention_bias", False) or getattr(hc, "mlp_bias", False):
        problems.append("attention_bias / mlp_bias (we have no biases)")
    if rope_type != "default":
        problems.append(f"rope_type={rope_type!r} (we implement the default rotary embedding)")
    if getattr(hc, "pretraining_tp", 1) != 1:
        problems.append(f"pretraining_tp={hc.pretraining_tp}")
    hd = getattr(hc, "head_dim", None) or hc.hidden_size // hc.num_attention_heads
    if hd * hc.num_attention_heads != hc.hidden_size:
        problems.append(f"head_dim={hd} x {hc.num_attention_heads} heads != hidden_size={hc.hidden_size}")
    if problems:
        raise ValueError("cannot import this LLaMA into mars Llama: " + "; ".join(problems))
    config = LlamaConfig(
        n_layer=hc.num_hidden_layers,
        n_head=hc.num_attention_heads,
        n_kv_head=hc.num_key_value_heads,
        n_embd=hc.hidden_size,
        block_size=hc.max_position_embeddings,
        vocab_size=hc.vocab_size,
        mlp_hidden=hc.intermediate_size,
        norm_eps=float(hc.rms_norm_eps),
        rope_theta=rope_theta(hc),
        tie_embeddings=bool(hc.tie_word_embeddings),
    )
    saved = _saved_config(getattr(hc, "mars_config", None))
    return saved if saved is not None and _same_function(saved, config) else config  # e.g. the 8/3 rule


def from_hf(hf_model) -> Llama:
    """Our Llama with the weights of a LlamaForCausalLM (same device, dtype and train/eval mode)."""
    config = config_from_hf(hf_model.config)
    theirs = hf_model.state_dict()
    ref = theirs["model.embed_tokens.weight"]
    model = Llama.empty(config, ref.device, dtype=ref.dtype)
    model.load_state_dict({k: theirs[k] for k in model.state_dict()}, strict=True)
    return model.train(hf_model.training)


def _saved_config(values: Any) -> LlamaConfig | None:
    from mars.model.spec import model_config

    try:
        config = model_config(values) if isinstance(values, dict) else None
    except ValueError:
        return None
    return config if isinstance(config, LlamaConfig) else None


def _same_function(a: LlamaConfig, b: LlamaConfig) -> bool:
    keys = (
        "n_layer",
        "n_head",
        "n_embd",
        "block_size",
        "vocab_size",
        "norm_eps",
        "rope_theta",
        "tie_embeddings",
    )
    return all(getattr(a, k) == getattr(b, k) for k in keys) and (kv_heads(a), mlp_hidden(a)) == (
        kv_heads(b),
        mlp_hidden(b),
    )


def finish_export(out_dir: str | Path, model: Llama) -> None:
    """After save_pretrained: config.json carries rope theta as both transformers 4.x (``rope_theta``)
    and 5.x (``rope_parameters``) read it, whichever version wrote the file."""
    theta = float(model.config.rope_theta)
    path = Path(out_dir) / "config.json"
    data = json.loads(path.read_text())
    data["rope_theta"] = theta
    params = dict(data.get("rope_parameters") or {})
    params.setdefault("rope_type", "default")
    params["rope_theta"] = theta
    data["rope_parameters"] = params
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
