"""Shared helpers: state buffers, step counters, matrix views, the orthogonalised update."""

from __future__ import annotations

import math

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


def step_counter(state: dict) -> Tensor:
    """The tensor's step count, state["step"]: a float32 CPU scalar, as in torch's own optimizers.

    A Python int would be a constant to torch.compile, so a compiled training step would recompile
    at every step; a CPU scalar is read without any device synchronisation. Created at 0 on first
    use; anything else found there (a Python int from state dicts written before the counter became
    a tensor, a counter moved to the GPU with the rest of the state) is converted once."""
    count = state.get("step")
    if not (isinstance(count, Tensor) and count.device.type == "cpu" and count.dtype == torch.float32):
        count = state["step"] = as_step_counter(0 if count is None else count)
    return count


def as_step_counter(value) -> Tensor:
    if isinstance(value, Tensor):
        return value.detach().to(device="cpu", dtype=torch.float32).reshape(())
    return torch.tensor(float(value), dtype=torch.float32)


def bucket_step(count: Tensor) -> int | None:
    """The step-count part of an update bucket's key: the count this step reaches (eager), or None
    inside torch.compile, where the bucket passes its counters to the kernels instead (see
    `advance_steps`)."""
    if torch.compiler.is_compiling():
        return None
    return int(count) + 1  # a CPU scalar: no device sync


def advance_steps(states: list[dict], step: int | None) -> int | list[Tensor]:
    """Add 1 to the step counters of a bucket; returns what the kernels take as `step`: the bucket's
    common count (eager), or the list of counters (inside torch.compile)."""
    counters = [s["step"] for s in states]
    torch._foreach_add_(counters, 1.0)
    return counters if step is None else step


def adam_hyper(
    *, lr, weight_decay, betas, eps: float, step, params: list[Tensor], eps_form: str = "torch"
) -> dict:
    """The hyperparameters of rules.adamw for a bucket that reaches step `step` (its common count, or
    inside torch.compile the list of its step counters): the bias corrections are numbers, or per
    tensor 0-dim tensors computed in float64 and handed over in the compute dtype.
    eps_form "torch": m / (sqrt(v / bc2) + eps) / bc1 (torch, MARS); "moonlight": m / (sqrt(v) + eps)
    * sqrt(bc2) / bc1, eps not bias-corrected (Moonlight, MARS-M), i.e. eps / sqrt(bc2) in the former."""
    beta1, beta2 = betas
    if isinstance(step, list):
        bc1, bc2_sqrt = [], []
        for count, p in zip(step, params, strict=True):
            t = count.to(torch.float64)
            dtype = torch.float64 if p.dtype == torch.float64 else torch.float32
            bc1.append((1.0 - beta1**t).to(device=p.device, dtype=dtype))
            bc2_sqrt.append((1.0 - beta2**t).sqrt().to(device=p.device, dtype=dtype))
        if eps_form != "torch":
            eps = [eps / b for b in bc2_sqrt]
    else:
        bc1, bc2_sqrt = 1.0 - beta1**step, math.sqrt(1.0 - beta2**step)
        if eps_form != "torch":
            eps = eps / bc2_sqrt
    return dict(
        lr=lr, weight_decay=weight_decay, beta1=beta1, beta2=beta2, bc1=bc1, bc2_sqrt=bc2_sqrt, eps=eps
    )


def traced(value: float, like: Tensor):
    """A param-group hyperparameter that a schedule may change (lr, weight_decay, gamma) as the kernels
    take it: the number itself, or inside torch.compile a 0-dim tensor made from it on `like`'s device.
    The compiler then takes the value as a graph input (after one recompile when it first changes)
    instead of a constant to guard on, so an lr schedule does not recompile the step at every step."""
    if not torch.compiler.is_compiling():
        return value
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    return torch.zeros((), dtype=dtype, device=like.device) + value


def matrix_shape(t: Tensor) -> tuple[int, int]:
    """The 2-D shape a >= 2-D tensor is orthogonalised as: (shape[0], product of the rest)."""
    return t.shape[0], t.numel() // t.shape[0]


def as_matrix(t: Tensor) -> Tensor:
    return t if t.ndim == 2 else t.reshape(t.shape[0], -1)


def apply_orthogonal_update_(params: list[Tensor], O, *, lr, weight_decay, scale: float) -> None:
    """x <- x (1 - lr wd) - lr scale O_i for the orthogonalised updates O (a batch (n, rows, cols), or a
    list of matrices), each shaped like params[i] as a matrix (a rank's pieces when sharded).

    O is bfloat16 (Newton-Schulz runs in bfloat16 by design); the update is applied in each
    parameter's own dtype (a float64 parameter keeps float64 precision outside O itself). lr and
    weight_decay are numbers, or 0-dim tensors inside torch.compile (`traced`)."""
    if isinstance(weight_decay, Tensor) or weight_decay:
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)
    updates = [o if o.shape == p.shape else o.reshape(p.shape) for o, p in zip(O, params, strict=True)]
    if isinstance(lr, Tensor):
        updates = [o.to(p.dtype) for o, p in zip(updates, params, strict=True)]
        torch._foreach_mul_(updates, -lr * scale)
        torch._foreach_add_(params, updates)
    else:
        torch._foreach_add_(params, updates, alpha=-lr * scale)
