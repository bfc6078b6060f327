"""AdamW, the baseline: torch.optim.AdamW with the reference grouping, as a registered optimizer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mars import checks

from ._contract import named_tensor
from .config import OptimizerConfig, each
from .mup import ELEMENTWISE
from .registry import register


@dataclass
class AdamWConfig(OptimizerConfig):
    """optimizer=adamw: the GPT-2 small reference run's values (docs/algorithms.md section 6); the weight
    decay applies to Linear weights (0 on embeddings, LayerNorm weights and biases). torch.optim.AdamW
    checks its own values; the config's are checked before the run starts."""

    name: str = "adamw"
    lr: float = 6e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    weight_decay: float = 0.1
    fused: bool | None = None  # None: torch's fused kernel where the parameters allow it
    value_checks = (
        each(checks.finite_non_negative, "lr", "eps", "weight_decay"),
        each(checks.fraction_pair, "betas"),
    )


def adamw(params, *, lr, betas, eps, weight_decay, fused) -> torch.optim.AdamW:
    """torch.optim.AdamW with AdamWConfig's values; fused=None takes torch's fused kernel where every
    parameter allows it."""
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


register("adamw", AdamWConfig, adamw, grouping="decay", mup=ELEMENTWISE)
