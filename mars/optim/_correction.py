"""The per-tensor clip of the MARS correction c_t (mars.optim.rules.correction) and the MARS diagnostics,
shared by MARS and MARS-M.

A step first computes, for every tensor on the MARS path, one row of sums in one pass over g and
g_prev (rules.grad_sums: ||g||^2, ||g_prev||^2, ||g - g_prev||^2), stacks all rows into one table
and, when the parameters are sharded (FSDP2 DTensors), sums it over the shards in ONE all-reduce.
For c = x g + y g_prev (MARS's c_t: x = 1 + k, y = -k; `rules.coefficients`), with
<g, g_prev> = (||g||^2 + ||g_prev||^2 - ||g - g_prev||^2) / 2:

    ||c||^2     = x^2 ||g||^2 + 2 x y <g, g_prev> + y^2 ||g_prev||^2
    ||c - g||^2 = (x - 1)^2 ||g||^2 + 2 (x - 1) y <g, g_prev> + y^2 ||g_prev||^2

The update kernels then take each tensor's scale 1 / max(||c||, 1) (rules.clip_scale). The result is
the same whether a tensor is whole or split over ranks. A c_t that is not linear gets ||c||^2 and
||c - g||^2 from c itself (rules.correction_sums), in the same table.

Diagnostics (diagnostics=True) cost nothing more: they are read off the same table and folded into
an accumulator on the device; nothing is read back until `Diagnostics.read()` (the trainer calls it
at log steps only). Reported (means over the steps since the last read; the max for c_norm_max):
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
# the table's columns: ||g||^2, ||g_prev||^2, ||g - g_prev||^2, ||c||^2, ||c - g||^2
G2, P2, D2, C2, CG2 = range(5)


@dataclass
class Work:
    """One bucket of tensors on the MARS path: local views of gradients and previous gradients, and
    what c_t is for them."""

    grads: list[Tensor]
    prevs: list[Tensor]
    correction: Callable
    linear: bool  # rules.is_linear(correction), decided at construction (not traced by torch.compile)
    gamma: float | Tensor
    beta: float
    clip: bool
    fused: bool | None


def _sums(w: Work, diagnostics: bool) -> Tensor:
    """The bucket's rows of the table, before the sum over shards (columns C2, CG2 still zero for a
    linear c_t: they are derived after it)."""
    args = ([w.grads, w.prevs],)
    if w.linear or diagnostics:
        sums = _kernels.norms(rules.grad_sums, *args, fused=w.fused)
    if w.linear:
        return torch.cat([sums, torch.zeros_like(sums[:, :2])], dim=1)
    direct = _kernels.norms(
        rules.correction_sums,
        *args,
        fused=w.fused,
        options={"correction": w.correction},
        gamma=w.gamma,
        beta=w.beta,
    )
    return torch.cat([sums if diagnostics else torch.zeros_like(direct[:, :1]).expand(-1, 3), direct], dim=1)


def _derive_(rows: Tensor, w: Work) -> None:
    """||c||^2 and ||c - g||^2 of a linear c_t from the summed sums (module docstring), in place."""
    x, y = rules.coefficients(w.correction, w.gamma, w.beta)
    g2, p2 = rows[:, G2], rows[:, P2]
    dot = (g2 + p2 - rows[:, D2]) / 2
    rows[:, C2] = x * x * g2 + 2 * x * y * dot + y * y * p2
    rows[:, CG2] = (x - 1) * (x - 1) * g2 + 2 * (x - 1) * y * dot + y * y * p2


def scales_and_stats(
    work: list[Work], sharding, diagnostics: Diagnostics | None
) -> list[list[Tensor] | float]:
    """Per bucket: the clip scales, one 0-dim tensor per tensor (1.0 where the bucket does not clip).
    With `diagnostics`, the step's table is added to it. One all-reduce over the shards for all."""
    wanted = [w for w in work if w.clip or diagnostics is not None]
    if not wanted:
        return [1.0] * len(work)
    parts = [_sums(w, diagnostics is not None) for w in wanted]
    dtype = torch.float64 if any(p.dtype == torch.float64 for p in parts) else torch.float32
    table = _dist.sum_over_shards_(torch.cat([p.to(dtype) for p in parts]), sharding)
    sizes = [len(w.grads) for w in wanted]
    for w, rows in zip(wanted, table.split(sizes), strict=True):
        if w.linear:
            _derive_(rows, w)
    scales = iter(rules.clip_scale(table[:, C2]).split(sizes))
    out: list[list[Tensor] | float] = []
    for w in work:
        if not (w.clip or diagnostics is not None):
            out.append(1.0)
            continue
        part = next(scales)
        out.append(list(part.unbind(0)) if w.clip else 1.0)
    if diagnostics is not None:
        diagnostics.add(table)
    return out


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
