"""The per-tensor clip of the MARS correction c_t (rules.clipped) and the MARS diagnostics, shared by
MARS and MARS-M.

The clip c~ = c / max(||c||, 1) needs the norm of each whole tensor before its update. A step first
computes ||c||^2 of every tensor on the MARS path in one pass over g and g_prev
(rules.correction_sq_norm: one compiled reduction over c per large tensor, multi-tensor ops for the
rest), stacks them into one vector and, when the parameters are sharded (FSDP2 DTensors), sums it
over the shards in ONE all-reduce per step; the updates then take each tensor's factor
1 / max(||c||, 1) (rules.clip_scale). The result is the same whether a tensor is whole or split over
ranks. The clip uses ||c||^2 of c itself, so any c_t is clipped the same way.

Diagnostics (diagnostics=True) take one more pass over g and g_prev (rules.correction_stats: ||c||^2,
||g||^2, ||g_prev||^2, ||g - g_prev||^2, ||c - g||^2 per tensor, summed over the shards in the same
all-reduce) and fold the step's figures into an accumulator on the device; nothing is read back until
`Diagnostics.read()` (the trainer calls it at log steps only). The updates do not depend on them.
Reported (means over the steps since the last read; the max for c_norm_max):
  mars/c_norm_mean, mars/c_norm_max  ||c|| over the MARS tensors (before the clip)
  mars/clip_fraction                  fraction of MARS tensors with ||c|| > 1 (clipped when clip_c)
  mars/grad_cos                       cosine between g_t and g_prev over all MARS tensors together
  mars/correction_ratio               ||c - g|| / ||g|| over all MARS tensors together
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from . import _dist, _kernels, rules

DIAGNOSTIC_KEYS = (
    "mars/c_norm_mean",
    "mars/c_norm_max",
    "mars/clip_fraction",
    "mars/grad_cos",
    "mars/correction_ratio",
)
# the columns of rules.correction_stats: ||c||^2, ||g||^2, ||g_prev||^2, ||g - g_prev||^2, ||c - g||^2
C2, G2, P2, D2, CG2 = range(5)


@dataclass
class Work:
    """One bucket of tensors on the MARS path: local views of gradients and previous gradients, and
    what c_t is for them."""

    grads: list[Tensor]
    prevs: list[Tensor]
    correction: Callable
    gamma: float | Tensor
    beta: float
    clip: bool
    fused: bool | None

    def table(self, rule) -> Tensor:
        return _kernels.norms(
            rule,
            [self.grads, self.prevs],
            fused=self.fused,
            options={"correction": self.correction},
            gamma=self.gamma,
            beta=self.beta,
        )


def _float(tables: list[Tensor]) -> list[Tensor]:
    dtype = torch.float64 if any(t.dtype == torch.float64 for t in tables) else torch.float32
    return [t.to(dtype) for t in tables]


def scales_and_stats(work: list[Work], sharding, diagnostics: Diagnostics | None) -> list:
    """Per bucket, its update's clip `scale`: the factors 1 / max(||c||, 1), one 0-dim tensor per
    tensor, or 1.0 (no clip). With `diagnostics`, the step's figures are added to it. At most one
    all-reduce over the shards."""
    clipped = [w for w in work if w.clip]
    parts = _float(
        [w.table(rules.correction_sq_norm) for w in clipped]
        + ([w.table(rules.correction_stats) for w in work] if diagnostics is not None else [])
    )
    if parts:
        sizes = [t.numel() for t in parts]
        flat = _dist.sum_over_shards_(torch.cat([t.reshape(-1) for t in parts]), sharding)
        parts = [f.view(t.shape) for f, t in zip(flat.split(sizes), parts, strict=True)]
    factors = iter(parts[: len(clipped)])
    if diagnostics is not None:
        diagnostics.add(torch.cat(parts[len(clipped) :]))
    return [list(rules.clip_scale(next(factors)[:, 0]).unbind(0)) if w.clip else 1.0 for w in work]


class Diagnostics:
    """Sums of the per-step MARS diagnostics on the device, read (and reset) at log steps."""

    def __init__(self) -> None:
        self._acc: Tensor | None = None  # [c_norm_mean, c_norm_max, clip_fraction, cos, ratio, steps]

    def add(self, table: Tensor) -> None:
        """Fold one step's table (see scales_and_stats) into the accumulator, on the device."""
        c_norm = table[:, C2].clamp(min=0).sqrt()
        tiny = torch.finfo(table.dtype).tiny
        g_total, p_total = table[:, G2].sum(), table[:, P2].sum()
        cos = (g_total + p_total - table[:, D2].sum()) / 2 / (g_total * p_total).sqrt().clamp(min=tiny)
        ratio = table[:, CG2].sum().clamp(min=0).sqrt() / g_total.sqrt().clamp(min=tiny)
        step = torch.stack(
            [
                c_norm.mean(),
                c_norm.max(),
                (c_norm > 1).to(table.dtype).mean(),
                cos,
                ratio,
                torch.ones_like(cos),
            ]
        )
        if self._acc is None:
            self._acc = step
        else:
            self._acc = torch.stack(
                [
                    self._acc[0] + step[0],
                    torch.maximum(self._acc[1], step[1]),
                    self._acc[2] + step[2],
                    self._acc[3] + step[3],
                    self._acc[4] + step[4],
                    self._acc[5] + 1,
                ]
            )

    def read(self) -> dict[str, float]:
        """Means over the steps since the last read (max for c_norm_max); {} when there were none.
        One read from the device."""
        if self._acc is None:
            return {}
        mean_, max_, clipped, cos, ratio, steps = self._acc.tolist()
        self._acc = None
        values = (mean_ / steps, max_, clipped / steps, cos / steps, ratio / steps)
        return dict(zip(DIAGNOSTIC_KEYS, values, strict=True))
