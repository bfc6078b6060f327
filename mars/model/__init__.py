"""mars.model: GPT-2 (gpt.GPT), its presets (config), checkpoints (io), FLOPs/MFU (flops) and
Hugging Face interop (hf, imported on demand: it loads transformers)."""

from mars.model.config import PRESETS, GPTConfig
from mars.model.gpt import GPT

__all__ = ["GPT", "GPTConfig", "PRESETS"]
