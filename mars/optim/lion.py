"""Lion (Chen et al., 2023), the baseline of MARS-Lion (docs/algorithms.md section 4)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch.optim import Optimizer

from . import _checks, _kernels, rules
from ._common import ensure_buffers, traced
from ._contract import TorchContract
from ._dist import local
from .config import ConfigChecks
from .registry import register


class Lion(TorchContract, Optimizer):
    r"""Lion: sign of an interpolated momentum, decoupled weight decay::

        u  = sign(beta1 m + (1 - beta1) g)
        x <- x (1 - lr weight_decay) - lr u
        m <- beta2 m + (1 - beta2) g

    MARS-Lion with gamma=0 and clip_c=False is Lion with beta2 = beta1. Lion steps have unit
    magnitude per coordinate: use a learning rate several times smaller than AdamW's and a weight
    decay several times larger. One state buffer ("exp_avg") per parameter. Non-finite gradients are
    not detected (no host sync); they make the update and m NaN (sign() is taken so that NaN stays
    NaN instead of becoming a silent 0), so check the gradient norm before step(). Tensors whose
    grad is None, or with no entries, are skipped. Arithmetic runs in float64 for float64 tensors,
    float32 otherwise. Behaves as a torch.optim optimizer: named parameters, state_dict round trips
    (refusing another optimizer's state), deepcopy/pickle, hooks, torch.compile of a training step.
    """

    needs_previous_grads = False

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, *, fused=None):
        defaults = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay)
        _validate(defaults)
        self.fused = fused
        super().__init__(params, defaults)
        _kernels.check_fused_flag("Lion", fused, _kernels.first_device(self.param_groups))

    def _validate_group(self, group: dict) -> None:
        _validate(group)

    def _buffer_names(self, p, group) -> set[str]:
        return {"exp_avg"}

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for params in self._buckets(group).values():
                ps = [local(p) for p in params]  # a DTensor's local shard: Lion is elementwise
                exp_avgs = [local(self.state[p]["exp_avg"]) for p in params]
                _kernels.update(
                    rules.lion,
                    [ps, [local(p.grad) for p in params], exp_avgs],
                    [ps, exp_avgs],
                    fused=self.fused,
                    lr=traced(group["lr"], params[0]),
                    weight_decay=traced(group["weight_decay"], params[0]),
                    beta1=beta1,
                    beta2=beta2,
                )
        return loss

    def _buckets(self, group: dict) -> dict[tuple, list]:
        """The group's tensors with a gradient, by (device, dtype): one kernel call each."""
        buckets = defaultdict(list)
        for p in group["params"]:
            if p.grad is None or p.numel() == 0:
                continue
            _checks.dense_grad("Lion", p)
            ensure_buffers(self.state[p], p, ("exp_avg",))
            buckets[(p.device, p.dtype)].append(p)
        return buckets


def _validate(group: dict) -> None:
    _checks.non_negative("Lion", "lr", group["lr"])
    _checks.non_negative("Lion", "weight_decay", group["weight_decay"])
    _checks.betas("Lion", "betas", group["betas"])


@dataclass
class LionConfig(ConfigChecks):
    """optimizer=lion. The MARS reference gives no GPT-2 Lion numbers: the Lion paper's rule of thumb
    against AdamW (lr 3-10x smaller, weight decay 3-10x larger). Tune before comparing."""

    name: str = "lion"
    lr: float = 1e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    weight_decay: float = 1.0
    fused: bool | None = None

    def validate(self) -> None:
        self._non_negative("lr", "weight_decay")
        self._pair_of_fractions("betas")


register("lion", LionConfig, Lion, grouping="decay")
