"""Optimizer configuration: the `optimizer.*` config keys, consumed by build_optimizer."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OptimizerConfig:
    # adamw | lion | muon | moonlight | mars_adamw | mars_lion | mars_shampoo | mars_m
    name: str = "mars_adamw"
    lr: float = 3e-3
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.95, 0.99])
    eps: float = 1e-8
    # MARS family
    gamma: float = 0.025
    approx: bool = True
    clip_c: bool = True
    optimize_1d: bool = False
    lr_1d: float = 3e-3
    betas_1d: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay_1d: float = 0.1
    two_dim_rule: str = "eq2"            # eq2: ndim == 2 (reference) | ge2: ndim >= 2
    # Muon / Moonlight / MARS-M
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    lean: bool = False                   # MARS-M one-buffer approximate variant
    # implementation
    fused: bool | None = None            # None: pick the fastest available implementation
