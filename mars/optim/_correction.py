"""The variance-reduction correction c_t = g_t + k (g_t - g_prev), k = gamma beta / (1 - beta), shared by
MARS and MARS-M: the per-tensor clip of c_t from whole-tensor norms, and the MARS diagnostics.

A step of MARS / MARS-M first computes ||c||^2 for every tensor on the MARS path (one reduction
kernel per tensor, or multi-tensor ops), stacks them into one vector and, when the parameters are
sharded (FSDP2 DTensors), sums that vector over the shards in ONE all-reduce; the update kernels
then take each tensor's scale 1 / max(||c||, 1). The result is the same whether a tensor is whole or
split over ranks, and the norm costs no more memory traffic than computing it inside the update.

Diagnostics (diagnostics=True) add three sums per tensor, (||g||^2, ||g_prev||^2, <g, g_prev>),
reduced in the same all-reduce, and fold the step's figures into an accumulator on the device:
nothing is read back until `Diagnostics.read()` (the trainer calls it at log steps only). From
c = (1 + k) g - k g_prev:  ||c - g|| = k ||g - g_prev||,  ||g - g_prev||^2 = ||g||^2 + ||g_prev||^2
- 2 <g, g_prev>. Reported (means over the steps since the last read; the max over them):
  mars/c_norm_mean, mars/c_norm_max  ||c|| over the MARS tensors (before the clip)
  mars/clip_fraction                  fraction of MARS tensors with ||c|| > 1 (clipped when clip_c)
  mars/grad_cos                       cosine between g_t and g_prev over all MARS tensors together
  mars/correction_ratio               ||c - g|| / ||g|| over all MARS tensors together
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from . import _dist, _kernels

DIAGNOSTIC_KEYS = (
    "mars/c_norm_mean",
    "mars/c_norm_max",
    "mars/clip_fraction",
    "mars/grad_cos",
    "mars/correction_ratio",
)


@dataclass
class Work:
    """One bucket of tensors on the MARS path: local views of gradients and previous gradients."""

    grads: list[Tensor]
    prevs: list[Tensor]
    k: float | Tensor
    clip: bool
    fused: bool | None


def scales_and_stats(
    work: list[Work], sharding, diagnostics: Diagnostics | None
) -> list[list[Tensor] | None]:
    """Per bucket: the clip scales (None where the bucket does not clip). With `diagnostics`, the step's
    raw (n, 5) table [||c||^2, ||g||^2, ||g_prev||^2, <g, g_prev>, k] is added to it. One all-reduce
    over the shards for everything, when sharded."""
    wanted = [w for w in work if w.clip or diagnostics is not None]
    if not wanted:
        return [None] * len(work)
    columns = []
    for w in wanted:
        impl = _kernels.select(w.fused, w.grads, w.prevs)
        sq = torch.stack(impl.correction_sqnorms(w.grads, w.prevs, k=w.k)).reshape(-1, 1)
        if diagnostics is not None:
            stats = torch.stack(impl.grad_stats(w.grads, w.prevs)).to(sq.dtype)
            sq = torch.cat([sq, stats], dim=1)
        columns.append(sq.to(torch.float64 if sq.dtype == torch.float64 else torch.float32))
    sizes = [len(w.grads) for w in wanted]
    table = _dist.sum_over_shards_(torch.cat(columns), sharding)
    norms = table[:, 0].clamp(min=0).sqrt()
    inverse = norms.clamp(min=1.0).reciprocal()
    scales: list[list[Tensor] | None] = []
    chunks = iter(inverse.split(sizes))  # one per bucket in `wanted`, in order
    for w in work:
        if not (w.clip or diagnostics is not None):
            scales.append(None)
            continue
        part = next(chunks)
        scales.append(list(part.unbind(0)) if w.clip else None)
    if diagnostics is None:
        return scales
    ks = torch.cat(
        [
            torch.as_tensor(w.k, dtype=table.dtype, device=table.device).reshape(1).expand(n)
            for w, n in zip(wanted, sizes, strict=True)
        ]
    )
    diagnostics.add(torch.cat([table, ks.reshape(-1, 1)], dim=1))
    return scales


class Diagnostics:
    """Sums of the per-step MARS diagnostics on the device, read (and reset) at log steps."""

    def __init__(self) -> None:
        self._acc: Tensor | None = None  # [c_norm_mean, c_norm_max, clip_fraction, cos, ratio, steps]

    def add(self, raw: Tensor) -> None:
        """Fold one step's raw table (see scales_and_stats) into the accumulator, on the device."""
        sq_c, g2, p2, dot, k = raw.unbind(1)
        c_norm = sq_c.clamp(min=0).sqrt()
        tiny = torch.finfo(raw.dtype).tiny
        g_total, p_total = g2.sum(), p2.sum()
        cos = dot.sum() / (g_total * p_total).sqrt().clamp(min=tiny)
        diff2 = (k * k * (g2 + p2 - 2 * dot)).sum().clamp(min=0)
        ratio = diff2.sqrt() / g_total.sqrt().clamp(min=tiny)
        step = torch.stack(
            [c_norm.mean(), c_norm.max(), (c_norm > 1).to(raw.dtype).mean(), cos, ratio, torch.ones_like(cos)]
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
