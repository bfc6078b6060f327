"""AdamW, the baseline: torch.optim.AdamW with the reference grouping, as a registered optimizer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ._contract import named_tensor
from .config import ConfigChecks
from .registry import register


@dataclass
class AdamWConfig(ConfigChecks):
    """optimizer=adamw. GPT-2 small reference: lr 6e-4, betas (0.9, 0.95), weight decay 0.1 on Linear
    weights (0 on embeddings, LayerNorm weights and biases)."""

    name: str = "adamw"
    lr: float = 6e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    fused: bool | None = None  # None: torch's fused kernel where the parameters allow it

    def validate(self) -> None:
        self._non_negative("lr", "eps", "weight_decay")
        self._pair_of_fractions("betas")


def adamw(params, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=None) -> torch.optim.AdamW:
    """torch.optim.AdamW; fused=None takes torch's fused kernel where every parameter allows it."""
    params = list(params)
    if fused is None:
        groups = params if params and isinstance(params[0], dict) else [{"params": params}]
        tensors = [named_tensor(p) for group in groups for p in group["params"]]
        fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in tensors)
    opt = torch.optim.AdamW(
        params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, fused=fused
    )
    opt.needs_previous_grads = False
    return opt


register("adamw", AdamWConfig, adamw, grouping="decay")
