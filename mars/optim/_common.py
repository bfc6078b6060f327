"""Small helpers shared by the optimizers: state buffers, matrix views, the orthogonalised update."""

from __future__ import annotations

import torch
from torch import Tensor


def zeros_like(p: Tensor) -> Tensor:
    """A state buffer: same dtype and device as p, always contiguous (the fused kernels flatten it)."""
    return torch.zeros_like(p, memory_format=torch.contiguous_format)


def ensure_buffers(state: dict, p: Tensor, names) -> None:
    """Create the missing zero buffers `names` (a tensor can change role, e.g. when a group's
    optimize_1d flips, so buffers are created when first needed, not all at once)."""
    for name in names:
        if name not in state:
            state[name] = zeros_like(p)


def matrix_shape(t: Tensor) -> tuple[int, int]:
    """The 2-D shape a >= 2-D tensor is orthogonalised as: (shape[0], product of the rest)."""
    return t.shape[0], t.numel() // t.shape[0]


def as_matrix(t: Tensor) -> Tensor:
    return t if t.ndim == 2 else t.reshape(t.shape[0], -1)


def apply_orthogonal_update_(
    params: list[Tensor], O: Tensor, *, lr: float, weight_decay: float, scale: float
) -> None:
    """x <- x (1 - lr wd) - lr scale O_i for the batch O (n, rows, cols) of orthogonalised updates."""
    if weight_decay:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)
    updates = [
        o if o.shape == p.shape else o.reshape(p.shape) for o, p in zip(O.unbind(0), params, strict=True)
    ]
    torch._foreach_add_(params, updates, alpha=-lr * scale)
