"""Hyperparameter validation shared by the optimizers: one ValueError naming the argument and its value."""

from __future__ import annotations

import math
from collections.abc import Iterable


def _fail(owner: str, name: str, value, rule: str) -> None:
    raise ValueError(f"{owner}: invalid {name}={value!r}: {rule}")


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def non_negative(owner: str, name: str, value) -> None:
    """lr, eps, weight decay, gamma: a finite number >= 0."""
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        _fail(owner, name, value, "must be a finite number >= 0")


def beta(owner: str, name: str, value) -> None:
    """A momentum coefficient in [0, 1)."""
    if not _is_number(value) or not 0.0 <= value < 1.0:
        _fail(owner, name, value, "must be a number in [0, 1)")


def betas(owner: str, name: str, value) -> None:
    """A pair of momentum coefficients, each in [0, 1)."""
    if not isinstance(value, Iterable) or isinstance(value, (str, bytes)) or len(tuple(value)) != 2:
        _fail(owner, name, value, "must be a pair (beta1, beta2)")
    for i, b in enumerate(value):
        if not _is_number(b) or not 0.0 <= b < 1.0:
            _fail(owner, name, tuple(value), f"{name}[{i}]={b!r} must be a number in [0, 1)")


def positive_int(owner: str, name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        _fail(owner, name, value, "must be an integer >= 1")


def choice(owner: str, name: str, value, choices: Iterable) -> None:
    choices = tuple(choices)
    if value not in choices:
        _fail(owner, name, value, f"must be one of {', '.join(map(repr, choices))}")


def flag(owner: str, name: str, value) -> None:
    if not isinstance(value, bool):
        _fail(owner, name, value, "must be True or False")


def dense_grad(owner: str, p) -> None:
    """Sparse gradients have no per-tensor norm or moment buffers here: say so and how to avoid them."""
    if p.grad.is_sparse:
        raise RuntimeError(
            f"{owner} does not support sparse gradients (parameter of shape {tuple(p.shape)}); "
            "use dense gradients, e.g. nn.Embedding(..., sparse=False)"
        )


def real_floating(owner: str, p) -> None:
    """The updates are real arithmetic (norms, signs, square roots, Newton-Schulz): refuse other dtypes
    at construction instead of stepping them wrongly."""
    if p.is_floating_point():
        return
    if p.is_complex():
        fix = (
            "keep the real and imaginary parts as a real parameter instead (store torch.view_as_real(z) "
            "as the nn.Parameter and use torch.view_as_complex(param) in forward)"
        )
    else:
        fix = "only floating-point tensors can be optimized: leave it out of the optimizer (e.g. a buffer)"
    raise ValueError(
        f"{owner} does not support a parameter of shape {tuple(p.shape)} and dtype {p.dtype}: it "
        f"updates real floating-point tensors (float32, float64, bfloat16, float16); {fix}"
    )


def correction(owner: str, cls: type) -> None:
    """An optimizer's c_t (`correction`) must be a static method: the kernels compile one per function."""
    import inspect

    if not isinstance(inspect.getattr_static(cls, "correction", None), staticmethod):
        raise TypeError(
            f"{cls.__name__}.correction must be a @staticmethod correction(g, g_prev, gamma, beta) returning "
            f"c_t (see {owner}'s docstring)"
        )
