"""AdamW, the baseline: torch.optim.AdamW with the reference grouping, as a registered optimizer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .config import ConfigChecks
from .groups import param_groups
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


def _torch_fused_ok(model: nn.Module) -> bool:
    return all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in model.parameters())


def build(model: nn.Module, cfg: AdamWConfig, process_group=None) -> torch.optim.Optimizer:
    fused = _torch_fused_ok(model) if cfg.fused is None else cfg.fused
    opt = torch.optim.AdamW(
        param_groups(model, "adamw", weight_decay=cfg.weight_decay),
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=fused,
    )
    opt.needs_previous_grads = False
    return opt


register("adamw", AdamWConfig, build, grouping="decay")
