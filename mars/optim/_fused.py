"""Fused per-tensor update kernels, compiled with torch.compile (Inductor: C++/OpenMP on CPU, Triton on GPU).

Same functions and signatures as `_foreach.py`. Each tensor is updated by one compiled kernel that
reads every input once and writes every output once, instead of one memory pass per arithmetic
operation; the MARS clip's norm is one reduction kernel before it (`correction_sqnorms`), whose
per-tensor scale the update kernel takes as an input. Tensors are flattened so one
dynamic-shape compilation serves every parameter shape. Hyperparameters travel as one small tensor
(float32, float64 for float64 tensors) on the parameter's device, so changing lr, gamma or the step
never recompiles and nothing is read back to the host.

Tensors under FUSED_MIN_NUMEL entries take the multi-tensor path (see below). Arithmetic runs in
the wider of float32 and the storage dtype: float64 tensors in float64, float32, bf16 and fp16 ones
in float32 (upcast on load, rounded once on store). Inside an outer torch.compile of a training step
these kernels are not used (`_kernels.select`). If compilation fails (no C++ compiler, no Triton),
the kernel runs its own Python body eagerly for that call and the package switches to the
multi-tensor implementation (`available()` turns False) with one warning.
"""

from __future__ import annotations

import functools
import math
import shutil
import warnings

import torch
from torch import Tensor

from . import _foreach

_disabled_reason: str | None = None


def available(device: torch.device) -> bool:
    """Whether compiled kernels can be used for tensors on `device`."""
    return _disabled_reason is None and _toolchain(device.type)


@functools.cache
def _toolchain(device_type: str) -> bool:
    if not hasattr(torch, "compile"):
        return False
    if device_type == "cpu":
        return any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++"))
    if device_type == "cuda":
        try:
            from torch.utils._triton import has_triton
        except ImportError:
            return False
        return has_triton()
    return False


def _disable(err: BaseException) -> None:
    global _disabled_reason
    if _disabled_reason is None:
        _disabled_reason = f"{type(err).__name__}: {err}"
        warnings.warn(
            "mars.optim: torch.compile of the fused optimizer kernels failed "
            f"({_disabled_reason.splitlines()[0][:300]}); using the multi-tensor implementation instead "
            "(same results, slower). Pass fused=False to silence this.",
            RuntimeWarning,
            stacklevel=3,
        )


# Inductor decides at compile time, from the first call's sizes, whether a CPU kernel runs its loop
# in parallel, and the FX graph cache then reuses that decision for every size: a kernel first
# compiled for a small tensor would update a 38M-entry embedding on one thread. dynamic_threads
# always emits the parallel loop and lets OpenMP size the team at run time (also no recompile when
# torch.set_num_threads changes). Small tensors never reach these kernels (FUSED_MIN_NUMEL).
_INDUCTOR_OPTIONS = {"cpp.dynamic_threads": True}


class _Kernel:
    """A kernel body compiled on first use; its own eager body if compilation fails."""

    def __init__(self, fn):
        self.fn = fn
        self._compiled = None

    def __call__(self, *args):
        if _disabled_reason is not None:
            return self.fn(*args)
        try:
            if self._compiled is None:
                self._compiled = torch.compile(
                    self.fn, dynamic=True, fullgraph=True, options=_INDUCTOR_OPTIONS
                )
            return self._compiled(*args)
        except Exception as err:  # noqa: BLE001 - a broken toolchain must not stop training
            _disable(err)
            return self.fn(*args)


def _flat(t: Tensor) -> Tensor:
    return t.detach().view(-1)


def _scalars(values: list[float], like: Tensor) -> Tensor:
    """The hyperparameters of a kernel call, on `like`'s device, in its compute dtype."""
    t = torch.tensor(values, dtype=_compute_dtype(like.dtype))
    device = like.device
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _unit_scales(scales, tensors: list[Tensor]):
    """The clip scales as the kernels take them: the given ones, or 1 for every tensor (no clip)."""
    if scales is not None:
        return scales
    like = tensors[0]
    return [torch.ones((), dtype=_compute_dtype(like.dtype), device=like.device)] * len(tensors)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _wide(t: Tensor) -> Tensor:
    """t in its compute dtype (a no-op for float32 and float64; decided when the kernel is traced)."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


# ---- kernel bodies (one tensor each). Separate functions, not flags, for variants that change the
# graph, so each has its own compile cache.


def _sign(x):
    """sign(x) + 0 x: sign for finite x, NaN for NaN/inf (torch.sign(NaN) is 0 and would hide it)."""
    return torch.sign(x) + x * 0.0


def _adamw_body(p, g, m, v, hp):
    lr, wd, b1, b2, bc1, inv_bc2_sqrt, eps = hp.unbind(0)
    gf = _wide(g)
    mf = _wide(m) * b1 + gf * (1.0 - b1)
    vf = _wide(v) * b2 + gf * gf * (1.0 - b2)
    pf = _wide(p)
    p.copy_(pf - lr * (wd * pf + mf / ((vf.sqrt() * inv_bc2_sqrt + eps) * bc1)))
    m.copy_(mf)
    v.copy_(vf)


def _mars_body(p, g, gp, m, v, hp, s):
    """s: the tensor's clip scale 1 / max(||c||, 1) (1 without the clip), computed beforehand from the
    whole tensor's norm (mars.optim._correction), so a shard of a sharded tensor is clipped exactly."""
    lr, wd, b1, b2, bc1, inv_bc2_sqrt, eps, k = hp.unbind(0)
    gf = _wide(g)
    c = ((gf - _wide(gp)) * k + gf) * s
    mf = _wide(m) * b1 + c * (1.0 - b1)
    if v is None:  # MARS-Lion
        update = _sign(mf)
    else:  # MARS-AdamW
        vf = _wide(v) * b2 + c * c * (1.0 - b2)
        update = mf / ((vf.sqrt() * inv_bc2_sqrt + eps) * bc1)
        v.copy_(vf)
    pf = _wide(p)
    p.copy_(pf - lr * (wd * pf + update))
    m.copy_(mf)
    gp.copy_(g)


def _mars_adamw_body(p, g, gp, m, v, hp, s):
    _mars_body(p, g, gp, m, v, hp, s)


def _mars_lion_body(p, g, gp, m, hp, s):
    _mars_body(p, g, gp, m, None, hp, s)


def _correction_sq_body(g, gp, hp):
    """||c||^2 of one tensor (or of this rank's piece of it), c = g + k (g - g_prev)."""
    k = hp[0]
    gf = _wide(g)
    c = (gf - _wide(gp)) * k + gf
    return (c * c).sum()


def _grad_stats_body(g, gp):
    """(||g||^2, ||g_prev||^2, <g, g_prev>) of one tensor: the MARS diagnostics' raw sums."""
    gf, pf = _wide(g), _wide(gp)
    return torch.stack([(gf * gf).sum(), (pf * pf).sum(), (gf * pf).sum()])


def _lion_body(p, g, m, hp):
    lr, wd, b1, b2 = hp.unbind(0)
    gf, mf = _wide(g), _wide(m)
    update = _sign(mf * b1 + gf * (1.0 - b1))
    p.copy_(_wide(p) * (1.0 - lr * wd) - lr * update)
    m.copy_(mf * b2 + gf * (1.0 - b2))


def _sgd_momentum_body(g, buf, out, hp, nesterov: bool):
    mu = hp[0]
    gf = _wide(g)
    bf = _wide(buf) * mu + gf
    buf.copy_(bf)
    out.copy_(gf + mu * bf if nesterov else bf)


def _ema_momentum_body(g, buf, out, hp, nesterov: bool):
    beta = hp[0]
    gf = _wide(g)
    bf = _wide(buf) * beta + gf * (1.0 - beta)
    buf.copy_(bf)
    out.copy_(gf * (1.0 - beta) + bf * beta if nesterov else bf)


def _mars_momentum_body(g, gp, buf, out, hp, s):
    beta, k, out_scale = hp.unbind(0)
    gf = _wide(g)
    c = ((gf - _wide(gp)) * k + gf) * s
    bf = _wide(buf) * beta + c * (1.0 - beta)
    buf.copy_(bf)
    gp.copy_(g)
    out.copy_(bf * out_scale)


def _lean_momentum_body(g, buf, out, hp):
    mu, factor, gamma = hp.unbind(0)
    gf = _wide(g)
    bf = _wide(buf) * mu + gf * factor
    buf.copy_(bf)
    out.copy_(gf * gamma + bf * mu)


_adamw = _Kernel(_adamw_body)
_mars_adamw = _Kernel(_mars_adamw_body)
_mars_lion = _Kernel(_mars_lion_body)
_correction_sq = _Kernel(_correction_sq_body)
_grad_stats = _Kernel(_grad_stats_body)
_lion = _Kernel(_lion_body)
_sgd_momentum = _Kernel(_sgd_momentum_body)
_ema_momentum = _Kernel(_ema_momentum_body)
_mars_momentum = _Kernel(_mars_momentum_body)
_lean_momentum = _Kernel(_lean_momentum_body)


# ---- list-level API, identical to _foreach.py. Tensors under FUSED_MIN_NUMEL entries (LayerNorm
# weights, biases) go to the multi-tensor version instead: a compiled call costs ~50 us of guards and
# a parallel region, more than the memory passes it saves on a small tensor (ATen's own parallel
# grain size is the same 32768).

FUSED_MIN_NUMEL = 32768


def _small_tensors_on_foreach(fused_fn):
    """Run `fused_fn` on the large tensors and its _foreach namesake on the small ones. Positional
    arguments are parallel lists of tensors (or None); keywords are passed to both."""
    foreach_fn = getattr(_foreach, fused_fn.__name__)

    def part(lists, mask, keep):
        return [
            None if lst is None else [t for t, m in zip(lst, mask, strict=True) if m == keep] for lst in lists
        ]

    @functools.wraps(fused_fn)
    def run(*lists, **kwargs):
        big = [t.numel() >= FUSED_MIN_NUMEL for t in lists[0]]
        if not all(big):
            foreach_fn(*part(lists, big, False), **kwargs)
        if any(big):
            fused_fn(*part(lists, big, True), **kwargs)

    return run


@_small_tensors_on_foreach
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
    if max_exp_avg_sqs is not None:
        raise NotImplementedError("amsgrad runs on the multi-tensor implementation")
    bc1, bc2_sqrt = 1.0 - beta1**step, math.sqrt(1.0 - beta2**step)
    eps = eps if eps_form == "torch" else eps / bc2_sqrt
    hp = _scalars([lr, weight_decay, beta1, beta2, bc1, 1.0 / bc2_sqrt, eps], params[0])
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs, strict=True):
        _adamw(_flat(p), _flat(g), _flat(m), _flat(v), hp)


@_small_tensors_on_foreach
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
    if max_exp_avg_sqs is not None:
        raise NotImplementedError("amsgrad runs on the multi-tensor implementation")
    bc1, bc2_sqrt = 1.0 - beta1**step, math.sqrt(1.0 - beta2**step)
    k = gamma * beta1 / (1.0 - beta1)
    hp = _scalars([lr, weight_decay, beta1, beta2, bc1, 1.0 / bc2_sqrt, eps, k], params[0])
    scales = _unit_scales(scales, params)
    if kind == "adamw":
        for p, g, gp, m, v, sc in zip(params, grads, prevs, exp_avgs, exp_avg_sqs, scales, strict=True):
            _mars_adamw(_flat(p), _flat(g), _flat(gp), _flat(m), _flat(v), hp, sc)
    else:
        for p, g, gp, m, sc in zip(params, grads, prevs, exp_avgs, scales, strict=True):
            _mars_lion(_flat(p), _flat(g), _flat(gp), _flat(m), hp, sc)


def correction_sqnorms(grads, prevs, *, k) -> list[Tensor]:
    """||c||^2 per tensor (0-dim, compute dtype), c = g + k (g - g_prev); small tensors multi-tensor."""
    return _split_by_size(_correction_sqnorms_fused, "correction_sqnorms", grads, prevs, k=k)


def _correction_sqnorms_fused(grads, prevs, *, k) -> list[Tensor]:
    hp = _scalars([k], grads[0])
    return [_correction_sq(_flat(g), _flat(gp), hp) for g, gp in zip(grads, prevs, strict=True)]


def grad_stats(grads, prevs) -> list[Tensor]:
    """(||g||^2, ||g_prev||^2, <g, g_prev>) per tensor, each a (3,) tensor in the compute dtype."""
    return _split_by_size(_grad_stats_fused, "grad_stats", grads, prevs)


def _grad_stats_fused(grads, prevs) -> list[Tensor]:
    return [_grad_stats(_flat(g), _flat(gp)) for g, gp in zip(grads, prevs, strict=True)]


def _split_by_size(fused_fn, name: str, *lists, **kwargs) -> list[Tensor]:
    """A per-tensor reduction: the fused kernel on large tensors, the multi-tensor one on small ones,
    results in input order."""
    big = [t.numel() >= FUSED_MIN_NUMEL for t in lists[0]]
    out: list[Tensor | None] = [None] * len(big)
    for keep, fn in ((False, getattr(_foreach, name)), (True, fused_fn)):
        idx = [i for i, b in enumerate(big) if b == keep]
        if idx:
            for i, r in zip(idx, fn(*[[lst[i] for i in idx] for lst in lists], **kwargs), strict=True):
                out[i] = r
    return out


@_small_tensors_on_foreach
def lion_(params, grads, exp_avgs, *, lr, weight_decay, beta1, beta2) -> None:
    hp = _scalars([lr, weight_decay, beta1, beta2], params[0])
    for p, g, m in zip(params, grads, exp_avgs, strict=True):
        _lion(_flat(p), _flat(g), _flat(m), hp)


@_small_tensors_on_foreach
def sgd_momentum_(grads, bufs, outs, *, momentum, nesterov) -> None:
    hp = _scalars([momentum], grads[0])
    for g, b, o in zip(grads, bufs, outs, strict=True):
        _sgd_momentum(_flat(g), _flat(b), _flat(o), hp, nesterov)


@_small_tensors_on_foreach
def ema_momentum_(grads, bufs, outs, *, beta, nesterov) -> None:
    hp = _scalars([beta], grads[0])
    for g, b, o in zip(grads, bufs, outs, strict=True):
        _ema_momentum(_flat(g), _flat(b), _flat(o), hp, nesterov)


@_small_tensors_on_foreach
def mars_momentum_(grads, prevs, bufs, outs, scales, *, beta, gamma, out_scale) -> None:
    hp = _scalars([beta, gamma * beta / (1.0 - beta), out_scale], grads[0])
    scales = _unit_scales(scales, grads)
    for g, gp, b, o, sc in zip(grads, prevs, bufs, outs, scales, strict=True):
        _mars_momentum(_flat(g), _flat(gp), _flat(b), _flat(o), hp, sc)


@_small_tensors_on_foreach
def lean_momentum_(grads, bufs, outs, *, momentum, gamma) -> None:
    factor = (1.0 - gamma) * (1.0 - momentum) / momentum
    hp = _scalars([momentum, factor, gamma], grads[0])
    for g, b, o in zip(grads, bufs, outs, strict=True):
        _lean_momentum(_flat(g), _flat(b), _flat(o), hp)
