"""mars.model: the architectures (spec: the registry of `model.arch`; gpt: GPT-2; llama: LLaMA-style),
checkpoints (io), FLOPs/MFU (flops) and Hugging Face interop (hf, hf_llama; imported on demand: they
load transformers)."""

from mars.model.config import PRESETS, GPTConfig
from mars.model.gpt import GPT
from mars.model.llama import Llama, LlamaConfig
from mars.model.spec import ModelSpec, arch, arch_names, model_config, register_arch, spec_of

__all__ = [
    "GPT",
    "GPTConfig",
    "PRESETS",
    "Llama",
    "LlamaConfig",
    "ModelSpec",
    "arch",
    "arch_names",
    "model_config",
    "register_arch",
    "spec_of",
]
