"""mars.model: the architectures (spec: the registry of `model.arch`; gpt: GPT-2; llama: LLaMA-style; lm:
what they share), MFU (flops) and Hugging Face interop (hf, with one adapter per architecture: hf_gpt2,
hf_llama; imported on demand: they load transformers). Model files on disk: mars.checkpoint.model_dir."""

from mars.model.gpt import GPT, GPT_PRESETS, GPTConfig
from mars.model.llama import Llama, LlamaConfig
from mars.model.spec import ModelSpec, arch, arch_names, model_config, register_arch, spec_of

PRESETS = GPT_PRESETS  # the name GPT_PRESETS had before mars.eval's task presets got theirs

__all__ = [
    "GPT",
    "GPTConfig",
    "GPT_PRESETS",
    "Llama",
    "LlamaConfig",
    "ModelSpec",
    "arch",
    "arch_names",
    "model_config",
    "register_arch",
    "spec_of",
]
