"""Lion (Chen et al., 2023), the baseline of MARS-Lion (docs/algorithms.md section 4)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.optim import Optimizer

from mars import checks

from . import _kernels, rules
from ._contract import TorchContract
from ._dist import local
from ._step import BucketedStep, group_value
from .config import OptimizerConfig, each
from .mup import ELEMENTWISE
from .registry import register

# The values Lion takes: its constructor and its config check them (mars.optim.config).
VALUE_CHECKS = (
    each(checks.finite_non_negative, "lr", "weight_decay"),
    each(checks.fraction_pair, "betas"),
)


class Lion(BucketedStep, TorchContract, Optimizer):
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

    owner = "Lion"
    value_checks = VALUE_CHECKS
    needs_previous_grads = False

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, *, fused=None):
        self.fused = fused
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))
        _kernels.check_fused_flag(self.owner, fused, _kernels.first_device(self.param_groups))

    def _role(self, p, group) -> str:
        return "lion"

    def _buffers(self, role: str, group: dict, every: bool = False) -> tuple[str, ...]:
        return ("exp_avg",)

    def _update(self, group: dict, role: str, params: list, step, scales) -> None:
        beta1, beta2 = group["betas"]
        ps = [local(p) for p in params]  # a DTensor's local shard: Lion is elementwise
        exp_avgs = [local(self.state[p]["exp_avg"]) for p in params]
        _kernels.update(
            rules.lion,
            [ps, [local(p.grad) for p in params], exp_avgs],
            [ps, exp_avgs],
            fused=self.fused,
            gate=self._gate,
            lr=group_value(group, "lr", params[0]),
            weight_decay=group_value(group, "weight_decay", params[0]),
            beta1=beta1,
            beta2=beta2,
        )


@dataclass
class LionConfig(OptimizerConfig):
    """optimizer=lion. The MARS reference gives no GPT-2 Lion numbers: the Lion paper's rule of thumb
    against AdamW (lr 3-10x smaller, weight decay 3-10x larger). Tune before comparing."""

    name: str = "lion"
    lr: float = 1e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    weight_decay: float = 1.0
    fused: bool | None = None
    value_checks = VALUE_CHECKS


register("lion", LionConfig, Lion, grouping="decay", mup=ELEMENTWISE)
