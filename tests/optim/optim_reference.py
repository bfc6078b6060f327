"""Plain per-parameter reference updates written straight from docs/algorithms.md, for the tests.

One tensor at a time, one operation per line, no fusion, no buckets: obviously right rather than
fast. Every function updates `p` and the `state` dict in place; `g_prev` is passed explicitly (the
approximate/exact distinction lives in the test driver, which decides what g_prev is).
"""

from __future__ import annotations

import math

import torch

A, B, C = 3.4445, -4.7750, 2.0315


def ns_reference(M, eps, steps=5):
    """MARS-Shampoo / Muon form: X = M / (||M|| + eps) in bf16, A = X X^T, B = A X, X = aX + bB + cAB."""
    X = M.bfloat16() / (M.norm() + eps)
    tall = M.size(0) > M.size(1)
    if tall:
        X = X.T
    for _ in range(steps):
        A_ = X @ X.T
        B_ = A_ @ X
        X = A * X + B * B_ + C * A_ @ B_
    if tall:
        X = X.T
    return X.to(M.dtype)


def ns_moonlight(G, steps=5):
    """Moonlight form: transpose, X / (||X|| + 1e-7) in bf16, A = X X^T, B = bA + cA^2, X = aX + BX."""
    X = G.bfloat16()
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.T
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A_ = X @ X.T
        B_ = B * A_ + C * A_ @ A_
        X = A * X + B_ @ X
    if tall:
        X = X.T
    return X


def _second_moment(state, v, amsgrad):
    if not amsgrad:
        return v
    vmax = state.setdefault("vmax", torch.zeros_like(v))
    torch.maximum(vmax, v, out=vmax)
    return vmax


def adamw(p, g, state, *, lr, betas, eps, wd, eps_form="torch", amsgrad=False):
    """AdamW on the raw gradient: the MARS 1-D path and Muon's AdamW side; eps_form="moonlight" (eps not
    bias-corrected) for Moonlight's and MARS-M's."""
    b1, b2 = betas
    state["step"] = state.get("step", 0) + 1
    t = state["step"]
    m = state.setdefault("m", torch.zeros_like(p))
    v = state.setdefault("v", torch.zeros_like(p))
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    v = _second_moment(state, v, amsgrad)
    if eps_form == "torch":
        step = m / ((v.sqrt() / math.sqrt(1 - b2**t) + eps) * (1 - b1**t))
        p.add_(-lr * (wd * p + step))
    else:
        p.mul_(1 - lr * wd)
        p.add_(m / (eps + v.sqrt()), alpha=-lr * math.sqrt(1 - b2**t) / (1 - b1**t))


def mars_c(g, g_prev, gamma, beta1, clip, c_fn=None):
    """c = g + gamma beta1/(1-beta1) (g - g_prev) (or c_fn(g, g_prev, gamma, beta1) for a variant),
    clipped to unit norm per tensor."""
    c = g + gamma * beta1 / (1 - beta1) * (g - g_prev) if c_fn is None else c_fn(g, g_prev, gamma, beta1)
    if clip and c.norm() > 1:
        c = c / c.norm()
    return c


def mars(
    p, g, g_prev, state, *, mars_type, lr, betas, eps, wd, gamma, clip, matrix, amsgrad=False, c_fn=None
):
    """One MARS step on a tensor taking the MARS path (spec section 1); `matrix`: it takes the 2-D rule."""
    b1, b2 = betas
    state["step"] = state.get("step", 0) + 1
    t = state["step"]
    c = mars_c(g, g_prev, gamma, b1, clip, c_fn)
    m = state.setdefault("m", torch.zeros_like(p))
    m.mul_(b1).add_(c, alpha=1 - b1)
    if mars_type == "mars-adamw" or (mars_type == "mars-shampoo" and not matrix):
        v = state.setdefault("v", torch.zeros_like(p))
        v.mul_(b2).addcmul_(c, c, value=1 - b2)
        v = _second_moment(state, v, amsgrad)
        step = m / ((v.sqrt() / math.sqrt(1 - b2**t) + eps) * (1 - b1**t))
    elif mars_type == "mars-lion":
        step = m.sign()
    else:
        M = m.reshape(m.shape[0], -1) / (1 - b1)
        step = ns_reference(M, eps).reshape(p.shape) * math.sqrt(max(1.0, M.shape[0] / M.shape[1]))
    p.add_(-lr * (wd * p + step))


def lion(p, g, state, *, lr, betas, wd):
    b1, b2 = betas
    m = state.setdefault("m", torch.zeros_like(p))
    u = (b1 * m + (1 - b1) * g).sign()
    p.mul_(1 - lr * wd).add_(u, alpha=-lr)
    m.mul_(b2).add_(g, alpha=1 - b2)


def muon(p, g, state, *, lr, momentum, nesterov, wd):
    buf = state.setdefault("buf", torch.zeros_like(p))
    buf.mul_(momentum).add_(g)
    u = g + momentum * buf if nesterov else buf
    O = ns_reference(u, 1e-7) * max(1.0, p.shape[0] / p.shape[1]) ** 0.5
    p.mul_(1 - lr * wd).add_(O, alpha=-lr)


def moonlight_update(p, O, lr, wd):
    p.mul_(1 - lr * wd)
    p.add_(O, alpha=-lr * 0.2 * math.sqrt(max(p.shape[0], p.shape[1])))


def moonlight(p, g, state, *, lr, momentum, nesterov, wd):
    M = state.setdefault("M", torch.zeros_like(p))
    M.mul_(momentum).add_(g, alpha=1 - momentum)
    U = (1 - momentum) * g + momentum * M if nesterov else M
    moonlight_update(p, ns_moonlight(U), lr, wd)


def mars_m(p, g, g_prev, state, *, lr, momentum, gamma, clip, wd, c_fn=None):
    M = state.setdefault("M", torch.zeros_like(p))
    c = mars_c(g, g_prev, gamma, momentum, clip, c_fn)
    M.mul_(momentum).add_(c, alpha=1 - momentum)
    moonlight_update(p, ns_moonlight(M), lr, wd)


def mars_m_lean(p, g, state, *, lr, momentum, gamma, wd):
    buf = state.setdefault("buf", torch.zeros_like(p))
    buf.mul_(momentum).add_(g, alpha=(1 - gamma) * (1 - momentum) / momentum)
    moonlight_update(p, ns_moonlight(gamma * g + momentum * buf), lr, wd)
