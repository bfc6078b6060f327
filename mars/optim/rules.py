"""The update rules of every optimizer here, each written once (notation of docs/algorithms.md).

A rule is a function of tensors and hyperparameters that returns new values; it never writes in place.
`mars.optim._kernels` runs the same function two ways:

- compiled: torch.compile makes it one fused kernel per tensor that reads each input once and writes
  each output once (C++ on CPU, Triton on CUDA; the default where a compiler exists);
- multi-tensor: each tensor argument is a `TensorList` of a whole bucket, whose arithmetic is
  torch._foreach_* ops (no compiler needed; an outer torch.compile of a training step traces these
  and fuses them itself).

So a rule uses arithmetic operators and the methods `sqrt`, `sign` and `maximum` of its tensor
arguments (and `norm`, in a reduction rule), nothing that only one of the two knows, and no Python
branch on tensor values. An update rule is elementwise: the same rule applies to any piece of a
tensor (a shard, a chunk). Tensor arguments arrive in the compute dtype (float32; float64 for
float64 tensors); hyperparameters are numbers or 0-dim tensors (per tensor, such as a clip factor,
or inside torch.compile).

The matrix optimizers' last step, x <- x (1 - lr wd) - lr scale O on a Newton-Schulz result O, is
written here too (`orthogonal_scale`, `apply_orthogonal_`), as in-place multi-tensor operations.

g gradient, g_prev previous gradient, c the MARS correction, m and v the first and second moments,
p the parameter, beta the momentum coefficient, gamma the weight of the correction.
"""

from __future__ import annotations

import torch

# ---- the MARS correction and its clip


def correction(g, g_prev, gamma, beta):
    """MARS's variance-reduced gradient c_t = g_t + k (g_t - g_prev), k = gamma beta / (1 - beta).

    The one definition of c_t: MARS (every mars_type), MARS-M, the clip, the diagnostics and MARS-M's
    lean variant (`lean_coefficients`) all use it. An optimizer variant with another c_t overrides
    `correction` in a subclass of MARS or MARSM (see their docstrings); like every update rule it
    must be elementwise (under FSDP2 it sees each rank's shard)."""
    return g + (g - g_prev) * (gamma * beta / (1.0 - beta))


def clipped(c, scale):
    """The per-tensor clip c~ = c / max(||c||, 1), as c times `scale`: the factor 1 / max(||c||, 1)
    of each whole tensor (`clip_scale`, computed beforehand by mars.optim._correction), 1 for no clip."""
    return c * scale


def clip_scale(sq_norm: torch.Tensor) -> torch.Tensor:
    """The factor 1 / max(||c||, 1) of `clipped` from ||c||^2 (summed over the pieces of a tensor)."""
    return sq_norm.clamp(min=0).sqrt().clamp(min=1.0).reciprocal()


def correction_sq_norm(g, g_prev, *, correction, gamma, beta):
    """Per tensor (||c||^2,), in one pass over g and g_prev: the norms of the clip. Like every
    reduction rule it returns sums over entries, so the sums of a tensor's pieces (its shards under
    FSDP2, the chunks of the multi-tensor path) add up to the whole tensor's."""
    return (_sq(correction(g, g_prev, gamma, beta)),)


def correction_stats(g, g_prev, *, correction, gamma, beta):
    """Per tensor ||c||^2, ||g||^2, ||g_prev||^2, ||g - g_prev||^2 and ||c - g||^2, in one pass over g
    and g_prev: the MARS diagnostics (mars.optim._correction)."""
    c = correction(g, g_prev, gamma, beta)
    return _sq(c), _sq(g), _sq(g_prev), _sq(g - g_prev), _sq(c - g)


def _sq(x):
    n = x.norm()
    return n * n


# ---- building blocks


def ema(avg, x, beta):
    """beta avg + (1 - beta) x: every momentum and second moment here."""
    return avg * beta + x * (1.0 - beta)


def signed(x):
    """sign(x), but NaN where x is NaN or inf (torch.sign(NaN) is 0, which would freeze the tensor
    silently instead of exposing the bad gradient)."""
    return x.sign() + x * 0.0


def decoupled(p, update, lr, weight_decay):
    """p - lr (weight_decay p + update): the step with decoupled weight decay."""
    return p - (p * weight_decay + update) * lr


def adam_direction(m, v, bc1, bc2_sqrt, eps):
    """m / ((sqrt(v) / sqrt(1 - beta2^t) + eps) (1 - beta1^t)): Adam's bias-corrected direction;
    bc1 = 1 - beta1^t, bc2_sqrt = sqrt(1 - beta2^t)."""
    return m / ((v.sqrt() / bc2_sqrt + eps) * bc1)


# ---- elementwise optimizers: each returns the new values of its state arguments, in order


def adamw(p, g, m, v, vmax=None, *, lr, weight_decay, beta1, beta2, bc1, bc2_sqrt, eps):
    """AdamW: (p, m, v), and vmax with amsgrad (vmax given)."""
    m = ema(m, g, beta1)
    v = ema(v, g * g, beta2)
    if vmax is not None:
        vmax = vmax.maximum(v)
    p = decoupled(p, adam_direction(m, v if vmax is None else vmax, bc1, bc2_sqrt, eps), lr, weight_decay)
    return (p, m, v) if vmax is None else (p, m, v, vmax)


def mars_adamw(p, g, g_prev, m, v, vmax=None, *, correction, gamma, scale, **adam):
    """MARS-AdamW: AdamW on c~ (`clipped`); returns (p, m, v[, vmax], g), g being the next g_prev."""
    c = clipped(correction(g, g_prev, gamma, adam["beta1"]), scale)
    return (*adamw(p, c, m, v, vmax, **adam), g)


def mars_lion(p, g, g_prev, m, *, correction, gamma, scale, lr, weight_decay, beta1):
    """MARS-Lion: m = ema(m, c~), p steps by sign(m); returns (p, m, g)."""
    m = ema(m, clipped(correction(g, g_prev, gamma, beta1), scale), beta1)
    return decoupled(p, signed(m), lr, weight_decay), m, g


def lion(p, g, m, *, lr, weight_decay, beta1, beta2):
    """Lion: p steps by sign(beta1 m + (1 - beta1) g), then m = ema(m, g, beta2); returns (p, m)."""
    return decoupled(p, signed(ema(m, g, beta1)), lr, weight_decay), ema(m, g, beta2)


# ---- momentum of the matrix optimizers: each returns (new buffer, Newton-Schulz input[, g])


def sgd_momentum(g, buf, *, beta, nesterov: bool):
    """Muon: buf = beta buf + g (beta: its momentum); NS input g + beta buf (Nesterov) or buf."""
    buf = buf * beta + g
    return buf, (g + buf * beta if nesterov else buf)


def ema_momentum(g, buf, *, beta, nesterov: bool):
    """Moonlight (MARS-M with gamma = 0): M = ema(M, G); NS input M, or ema(M, G) again (Nesterov)."""
    buf = ema(buf, g, beta)
    return buf, (ema(buf, g, beta) if nesterov else buf)


def mars_momentum(g, g_prev, buf, *, correction, gamma, beta, scale, out_scale):
    """MARS-M and MARS-Shampoo: m = ema(m, c~); NS input out_scale m; returns (m, NS input, g)."""
    buf = ema(buf, clipped(correction(g, g_prev, gamma, beta), scale), beta)
    return buf, buf * out_scale, g


def lean_momentum(g, buf, *, beta, a, b):
    """MARS-M's one-buffer form: buf = beta buf + b g; NS input a g + beta buf (see lean_coefficients)."""
    buf = buf * beta + g * b
    return buf, g * a + buf * beta


# ---- the orthogonalised step of the matrix optimizers (Muon, Moonlight, MARS-M, MARS-Shampoo)


def orthogonal_scale(form: str, rows: int, cols: int) -> float:
    """The scale of the orthogonalised update O of a rows x cols matrix: sqrt(max(1, rows/cols)) in the
    reference form (Muon, MARS-Shampoo), 0.2 sqrt(max(rows, cols)) in Moonlight's (Moonlight, MARS-M),
    which gives the update AdamW's typical RMS."""
    if form == "moonlight":
        return 0.2 * max(rows, cols) ** 0.5
    return max(1.0, rows / cols) ** 0.5


def apply_orthogonal_(params: list, O, *, lr, weight_decay, scale: float, gate=None) -> None:
    """x <- x (1 - lr wd) - lr scale O_i: `decoupled` for the orthogonalised updates O (a batch (n, rows,
    cols), or a list of matrices), each shaped like params[i] as a matrix (a rank's pieces when sharded).

    Unlike the rules above it writes in place, with the reference codes' two multi-tensor operations
    (no kernel): O is bfloat16 (Newton-Schulz runs in bfloat16 by design) and is applied in each
    parameter's own dtype, so a float64 parameter keeps float64 precision outside O itself. lr and
    weight_decay are numbers, or 0-dim tensors inside torch.compile. With a `gate` (0-dim bool tensor)
    the parameters change only where it is true (mars.optim._kernels: a skipped step)."""
    updates = [o if o.shape == p.shape else o.reshape(p.shape) for o, p in zip(O, params, strict=True)]
    out = params if gate is None else torch._foreach_mul(params, 1.0)  # gated: the new values aside first
    if isinstance(weight_decay, torch.Tensor) or weight_decay:
        torch._foreach_mul_(out, 1.0 - lr * weight_decay)
    if isinstance(lr, torch.Tensor):
        updates = [o.to(p.dtype) for o, p in zip(updates, params, strict=True)]
        torch._foreach_mul_(updates, -lr * scale)
        torch._foreach_add_(out, updates)
    else:
        torch._foreach_add_(out, updates, alpha=-lr * scale)
    if gate is not None:
        from ._kernels import _store

        _store(params, out, gate)


# ---- MARS-M's one-buffer form


def coefficients(correction, gamma, beta):
    """(x, y) with correction(g, g_prev, gamma, beta) = x g + y g_prev, read off at unit inputs
    (meaningful when `is_linear(correction)`): numbers, or 0-dim tensors when gamma is one."""
    one, zero = torch.ones((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    x, y = correction(one, zero, gamma, beta), correction(zero, one, gamma, beta)
    if not isinstance(gamma, torch.Tensor):  # numbers in, numbers out (CPU scalars: no device sync)
        x, y = float(x), float(y)
    return x, y


def lean_coefficients(correction, gamma, beta):
    """(a, b) of `lean_momentum`, derived from `correction`.

    For c linear in (g, g_prev), c = x g + y g_prev (x = 1 + k, y = -k for MARS's c_t), the
    unclipped approximate momentum M_t = beta M_{t-1} + (1 - beta) c_t equals a g_t + beta buf_t with
    buf_t = beta buf_{t-1} + b g_t, a = -(1 - beta) y / beta and b = ((1 - beta) x - a) / beta, so
    the previous gradient need not be kept (MARS's c_t gives a = gamma, b = (1 - gamma)(1 - beta) /
    beta)."""
    x, y = coefficients(correction, gamma, beta)
    a = -(1.0 - beta) * y / beta
    return a, ((1.0 - beta) * x - a) / beta


def is_linear(correction) -> bool:
    """Whether correction(g, g_prev, gamma, beta) = x g + y g_prev with x, y independent of g and
    g_prev (checked at several gamma, beta on random g, g_prev): what the lean variant needs."""
    gen = torch.Generator().manual_seed(0)
    g, g_prev = torch.randn(2, 8, generator=gen, dtype=torch.float64)
    for gamma, beta in ((0.025, 0.95), (0.7, 0.5), (0.0, 0.9)):
        x, y = coefficients(correction, gamma, beta)
        c = torch.as_tensor(correction(g, g_prev, gamma, beta))
        if c.shape != g.shape or not torch.allclose(c, x * g + y * g_prev, rtol=1e-9, atol=1e-12):
            return False
    return True
