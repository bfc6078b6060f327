"""Multi-tensor (torch._foreach_*) update kernels: the portable implementation.

Every function takes same-device, same-dtype lists of tensors and plain Python hyperparameters and
updates them in place. On CUDA each line is one multi-tensor launch; on CPU each line is a loop in
C++. No line reads a value back to the host. `_fused.py` has the same functions, compiled. This is
also the implementation traced by an outer torch.compile of a training step (which fuses it): there
`step` is the list of the tensors' step counters (0-dim tensors) instead of a Python int, and the
hyperparameters a schedule may change (lr, weight_decay, gamma) are 0-dim tensors
(`_common.traced`), so the compiled graph depends on neither.

Notation follows docs/algorithms.md: g gradient, g_prev previous gradient, c = g + k (g - g_prev) with
k = gamma * beta1 / (1 - beta1), c~ = c / max(||c||, 1) (per tensor), m, v first/second moments.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

Tensors = list[Tensor]


def _correction(grads: Tensors, prevs: Tensors, k, scales: Tensors | None = None) -> Tensors:
    """c = g + k (g - g_prev), times each tensor's clip scale 1 / max(||c||, 1) when `scales` is given
    (0-dim tensors computed beforehand from whole-tensor norms, see mars.optim._correction)."""
    c = torch._foreach_sub(grads, prevs)
    torch._foreach_mul_(c, k)
    torch._foreach_add_(c, grads)
    if scales is not None:
        torch._foreach_mul_(c, scales)
    return c


def correction_sqnorms(grads: Tensors, prevs: Tensors, *, k) -> Tensors:
    """||c||^2 per tensor (0-dim), c = g + k (g - g_prev)."""
    norms = torch._foreach_norm(_correction(grads, prevs, k))
    return torch._foreach_mul(norms, norms)


def grad_stats(grads: Tensors, prevs: Tensors) -> Tensors:
    """(||g||^2, ||g_prev||^2, <g, g_prev>) per tensor as (3,) tensors; the inner product from
    ||g - g_prev||^2 = ||g||^2 + ||g_prev||^2 - 2 <g, g_prev>."""
    g2 = [n * n for n in torch._foreach_norm(grads)]
    p2 = [n * n for n in torch._foreach_norm(prevs)]
    d2 = [n * n for n in torch._foreach_norm(torch._foreach_sub(grads, prevs))]
    return [torch.stack([a, b, (a + b - d) / 2]) for a, b, d in zip(g2, p2, d2, strict=True)]


def _ema_(bufs: Tensors, x: Tensors, beta: float) -> None:
    """buf <- beta buf + (1 - beta) x, in the reference's operation order."""
    torch._foreach_mul_(bufs, beta)
    torch._foreach_add_(bufs, x, alpha=1.0 - beta)


def _ema_sq_(bufs: Tensors, x: Tensors, beta: float) -> None:
    torch._foreach_mul_(bufs, beta)
    torch._foreach_addcmul_(bufs, x, x, value=1.0 - beta)


def _sign(tensors: Tensors) -> Tensors:
    """sign(t) + 0 t: exactly sign(t) for finite t, NaN where t is NaN or inf (torch.sign(NaN) is 0,
    which would silently freeze the tensor instead of exposing the bad gradient)."""
    signs = torch._foreach_sign(tensors)
    torch._foreach_add_(signs, tensors, alpha=0.0)
    return signs


def add_scaled_(tensors: Tensors, others: Tensors, scale) -> None:
    """tensors += scale * others, for a number or a 0-dim tensor `scale` (which is no `alpha=`)."""
    if isinstance(scale, Tensor):
        torch._foreach_add_(tensors, torch._foreach_mul(others, scale))
    else:
        torch._foreach_add_(tensors, others, alpha=scale)


def _nonzero(value) -> bool:
    """A number's truth, without reading a tensor (inside torch.compile the tensor is just applied)."""
    return isinstance(value, Tensor) or bool(value)


def _apply_(params: Tensors, updates: Tensors, lr, weight_decay) -> None:
    """x <- x - lr (wd x + update); `updates` is consumed."""
    if _nonzero(weight_decay):
        add_scaled_(updates, params, weight_decay)
    add_scaled_(params, updates, -lr)


def _bias_corrections(step, beta1: float, beta2: float, params: Tensors):
    """(1 - beta1^t, sqrt(1 - beta2^t)): Python floats for a Python step count; for a list of step
    counters (inside torch.compile), lists of 0-dim tensors, one per parameter, computed in float64
    and handed over in the parameter's compute dtype (float64 for float64, float32 otherwise)."""
    if not isinstance(step, list):
        return 1.0 - beta1**step, math.sqrt(1.0 - beta2**step)
    bc1, bc2_sqrt = [], []
    for count, p in zip(step, params, strict=True):
        t = count.to(torch.float64)
        dtype = torch.float64 if p.dtype == torch.float64 else torch.float32
        bc1.append((1.0 - beta1**t).to(device=p.device, dtype=dtype))
        bc2_sqrt.append((1.0 - beta2**t).sqrt().to(device=p.device, dtype=dtype))
    return bc1, bc2_sqrt


def _adam_apply_(params, exp_avgs, second, *, lr, weight_decay, bc1, bc2_sqrt, eps) -> None:
    """x <- x - lr (wd x + m / ((sqrt(v) / sqrt(bc2) + eps) bc1)); bc1, bc2_sqrt and eps are numbers or
    per-tensor lists (see _bias_corrections)."""
    denom = torch._foreach_sqrt(second)
    if isinstance(bc2_sqrt, list):
        torch._foreach_div_(denom, bc2_sqrt)
    else:
        torch._foreach_mul_(denom, 1.0 / bc2_sqrt)
    torch._foreach_add_(denom, eps)
    torch._foreach_mul_(denom, bc1)
    _apply_(params, torch._foreach_div(exp_avgs, denom), lr, weight_decay)


def _second_moment(exp_avg_sqs, max_exp_avg_sqs):
    if max_exp_avg_sqs is None:
        return exp_avg_sqs
    torch._foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs)
    return max_exp_avg_sqs


def adamw_(
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    *,
    lr,
    weight_decay,
    beta1,
    beta2,
    step,
    eps,
    eps_form="torch",
    max_exp_avg_sqs=None,
) -> None:
    """AdamW on the raw gradient. eps_form "torch": m / (sqrt(v / bc2) + eps) / bc1 (torch, MARS 1-D
    path); "moonlight": m / (sqrt(v) + eps) * sqrt(bc2) / bc1 (eps not bias-corrected)."""
    bc1, bc2_sqrt = _bias_corrections(step, beta1, beta2, params)
    if eps_form != "torch":
        eps = [eps / b for b in bc2_sqrt] if isinstance(bc2_sqrt, list) else eps / bc2_sqrt
    _ema_(exp_avgs, grads, beta1)
    _ema_sq_(exp_avg_sqs, grads, beta2)
    second = _second_moment(exp_avg_sqs, max_exp_avg_sqs)
    _adam_apply_(
        params, exp_avgs, second, lr=lr, weight_decay=weight_decay, bc1=bc1, bc2_sqrt=bc2_sqrt, eps=eps
    )


def mars_(
    params,
    grads,
    prevs,
    exp_avgs,
    exp_avg_sqs,
    scales,
    *,
    kind,
    lr,
    weight_decay,
    beta1,
    beta2,
    step,
    eps,
    gamma,
    max_exp_avg_sqs=None,
) -> None:
    """One MARS-AdamW (kind "adamw") or MARS-Lion (kind "lion") step with the clip scales `scales`
    (None: no clip); then g_prev <- g."""
    c = _correction(grads, prevs, gamma * beta1 / (1.0 - beta1), scales)
    _ema_(exp_avgs, c, beta1)
    if kind == "adamw":
        _ema_sq_(exp_avg_sqs, c, beta2)
        second = _second_moment(exp_avg_sqs, max_exp_avg_sqs)
        bc1, bc2_sqrt = _bias_corrections(step, beta1, beta2, params)
        _adam_apply_(
            params, exp_avgs, second, lr=lr, weight_decay=weight_decay, bc1=bc1, bc2_sqrt=bc2_sqrt, eps=eps
        )
    else:
        _apply_(params, _sign(exp_avgs), lr, weight_decay)
    torch._foreach_copy_(prevs, grads)


def lion_(params, grads, exp_avgs, *, lr, weight_decay, beta1, beta2) -> None:
    """Lion: x <- x (1 - lr wd) - lr sign(beta1 m + (1 - beta1) g); m <- beta2 m + (1 - beta2) g."""
    update = torch._foreach_mul(exp_avgs, beta1)
    torch._foreach_add_(update, grads, alpha=1.0 - beta1)
    update = _sign(update)
    if _nonzero(weight_decay):
        torch._foreach_mul_(params, 1.0 - lr * weight_decay)
    add_scaled_(params, update, -lr)
    _ema_(exp_avgs, grads, beta2)


# ---- momentum of the matrix optimizers: update the buffer, write the Newton-Schulz input to `outs`
# (bfloat16 slices of one batched tensor, shaped like the inputs).


def sgd_momentum_(grads, bufs, outs, *, momentum, nesterov) -> None:
    """Muon: buf <- mu buf + g; NS input g + mu buf (Nesterov) or buf."""
    torch._foreach_mul_(bufs, momentum)
    torch._foreach_add_(bufs, grads)
    torch._foreach_copy_(outs, torch._foreach_add(grads, bufs, alpha=momentum) if nesterov else bufs)


def ema_momentum_(grads, bufs, outs, *, beta, nesterov) -> None:
    """Moonlight (MARS-M with gamma = 0): M <- beta M + (1 - beta) G; NS input M, or with Nesterov
    (1 - beta) G + beta M."""
    _ema_(bufs, grads, beta)
    if nesterov:
        src = torch._foreach_mul(grads, 1.0 - beta)
        torch._foreach_add_(src, bufs, alpha=beta)
    else:
        src = bufs
    torch._foreach_copy_(outs, src)


def mars_momentum_(grads, prevs, bufs, outs, scales, *, beta, gamma, out_scale) -> None:
    """MARS-M / MARS-Shampoo: m <- beta m + (1 - beta) c~ (c~ = scale c); NS input out_scale * m;
    g_prev <- g."""
    c = _correction(grads, prevs, gamma * beta / (1.0 - beta), scales)
    _ema_(bufs, c, beta)
    torch._foreach_copy_(prevs, grads)
    torch._foreach_copy_(outs, torch._foreach_mul(bufs, out_scale) if out_scale != 1.0 else bufs)


def lean_momentum_(grads, bufs, outs, *, momentum, gamma) -> None:
    """Memory-lean approximate MARS-M: buf <- mu buf + ((1-gamma)(1-mu)/mu) g; NS input gamma g + mu buf."""
    torch._foreach_mul_(bufs, momentum)
    add_scaled_(bufs, grads, (1.0 - gamma) * (1.0 - momentum) / momentum)
    src = torch._foreach_mul(grads, gamma)
    torch._foreach_add_(src, bufs, alpha=momentum)
    torch._foreach_copy_(outs, src)
