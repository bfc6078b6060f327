"""The global gradient norm and its clip, equal in every parallel layout (one process, ddp, fsdp, HSDP).

torch.nn.utils.clip_grad_norm_ reduces each gradient whole with torch's norm kernel, which on CPU adds
a tensor's squares in float32 accumulators one after another (pytorch/pytorch#169237): once the
running sum dwarfs each square, roundings lose part of every addition, and the norm of a large tensor
comes out low, by more the larger it is (-6.6e-5 of gpt2_tiny's 12.9M-entry embedding gradient,
-3.5e-3 of a random 50304 x 768 one). An FSDP shard is half the tensor and loses about half as much,
so the sharded norm differed from the unsharded one, always upwards (docs/algorithms.md section 9.5).

Here no reduction is long: each gradient's rows (its last dim, at most a few thousand entries) are
reduced in float32, a 1-D gradient is taken entry by entry, and those pieces are squared and summed
in float64, over this rank's shards, then over the ranks holding the other shards (FSDP2 shards dim 0,
so a row is never split and its norm is the same number in every layout). What differs between
layouts is only the order of a float64 sum, ~1e-16 of the norm, far below float32 rounding. The cost:
one norm kernel per matrix instead of one multi-tensor launch, a float64 sum of (rows + 1-D entries)
numbers, one scalar all-reduce under FSDP2; no read back to the host.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

from mars.optim._dist import is_dtensor, local, sharding_of, sum_over_shards_


def _pieces(grad: Tensor) -> Tensor:
    """Numbers whose squares sum to ||grad||^2, each from at most one row: row norms of a matrix (or
    of a higher-dim tensor's last dim), the entries themselves of a vector."""
    if grad.ndim < 2:
        return grad.reshape(-1)
    return torch.linalg.vector_norm(grad.reshape(-1, grad.shape[-1]), dim=-1)


def _local_sqnorm(grads: list[Tensor], device: torch.device) -> Tensor:
    """Sum of the squares of this process's pieces of `grads` (float64, 0-dim)."""
    pieces = [_pieces(g) for g in map(local, grads) if g.numel() > 0]
    if not pieces:  # none, or only empty shards (a tensor with fewer rows than ranks)
        return torch.zeros((), dtype=torch.float64, device=device)
    return torch.cat(pieces).double().square().sum()


def grad_norm(params: Iterable[Tensor]) -> Tensor:
    """The L2 norm of all of `params`' gradients together (0-dim, on their device; float64 when the
    gradients are float64, else float32), over every rank's shards when they are FSDP2 DTensors;
    parameters without a gradient count as zero."""
    params = [p for p in params if p.grad is not None]
    if not params:
        return torch.zeros(())
    device = local(params[0].grad).device
    sharding = sharding_of(params)
    if sharding is None:
        sq = _local_sqnorm([p.grad for p in params], device)
    else:  # summed over the ranks holding the other shards (HSDP: over the shard dim only)
        sharded = [is_dtensor(p) and any(pl.is_shard() for pl in p.placements) for p in params]
        sq = _local_sqnorm([p.grad for p, s in zip(params, sharded, strict=True) if s], device)
        sum_over_shards_(sq, sharding)
        sq = sq + _local_sqnorm([p.grad for p, s in zip(params, sharded, strict=True) if not s], device)
    wide = all(local(p.grad).dtype == torch.float64 for p in params)
    return sq.sqrt().to(torch.float64 if wide else torch.float32)


def clip_grad_norm_(params: Iterable[Tensor], max_norm: float) -> Tensor:
    """Scale the gradients so that their global norm is at most `max_norm` (as torch's clip_grad_norm_:
    by max_norm / (norm + 1e-6) when that is below 1; `max_norm` inf: no clip). Returns the norm before."""
    params = [p for p in params if p.grad is not None]
    norm = grad_norm(params)
    if math.isfinite(max_norm) and params:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        torch._foreach_mul_([local(p.grad) for p in params], coef)
    return norm
