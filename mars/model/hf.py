"""Hugging Face interop for every architecture: a mars model to its transformers class and back, through
the adapter module its spec names (mars.model.hf_gpt2: GPT2LMHeadModel; mars.model.hf_llama:
LlamaForCausalLM). A checkpoint as a Hugging Face directory: mars.checkpoint.export.

Each adapter has HF_MODEL_TYPE, to_hf(model, attn_implementation="sdpa", tokenizer=None),
from_hf(hf_model) and optionally config_from_hf(hf_config, bias_nonzero) (the mars config a directory
imports as, without loading its model: train.init_from's check, which otherwise loads it), is_bias(name)
(the tensors bias_nonzero reads) and finish_export(out_dir, model) (mars.model.spec, ``hf_adapter``).
"""

from __future__ import annotations

import importlib

import torch.nn as nn

from mars.model.lm import unwrap_model
from mars.model.spec import arch, arch_names, spec_of


def to_hf(model: nn.Module, attn_implementation: str = "sdpa", tokenizer=None):
    """The transformers model (on the model's device and dtype, same train/eval mode) holding a copy of
    our weights: it shares no storage with ``model``. ``tokenizer``: the transformers tokenizer the
    model was trained with (its end-of-text token; default GPT-2's). A muP model (mars.model.mup) is
    exported as the SP model that computes the same function: its attention and output multipliers
    folded into the weights, which transformers' classes have no place for."""
    from mars.model.mup import as_sp

    inner = as_sp(unwrap_model(model))
    return spec_of(inner).hf().to_hf(inner, attn_implementation, tokenizer)


def from_hf(hf_model) -> nn.Module:
    """Our model with the weights of a transformers model (same device, dtype and train/eval mode),
    through the adapter of its model_type."""
    return adapter_for(hf_model.config.model_type).from_hf(hf_model)


def adapter_for(model_type: str):
    """The adapter module (mars.model.spec's hf_adapter) whose HF_MODEL_TYPE is ``model_type``."""
    adapters = [arch(n).hf_adapter for n in arch_names() if arch(n).hf_adapter]
    for name in adapters:
        module = importlib.import_module(name)
        if module.HF_MODEL_TYPE == model_type:
            return module
    kinds = ", ".join(importlib.import_module(n).HF_MODEL_TYPE for n in adapters)
    raise ValueError(f"no mars architecture imports a Hugging Face {model_type!r} model (known: {kinds})")
