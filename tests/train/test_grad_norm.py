"""mars.train.grad_norm: the global gradient norm is the float64 norm rounded to float32, whatever the
tensors' sizes and however they are split by rows (FSDP2's dim-0 shards); the clip is torch's.
The multi-rank cases (fsdp, HSDP, ddp against one process) are in test_fsdp.py and test_e2e.py."""

from __future__ import annotations

import math

import torch

from mars.train.grad_norm import clip_grad_norm_, grad_norm


def _params(*grads: torch.Tensor | None) -> list[torch.nn.Parameter]:
    params = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros(() if g is None else g.shape))
        p.grad = g
        params.append(p)
    return params


def _exact(params) -> float:
    return math.sqrt(sum(float(p.grad.double().square().sum()) for p in params if p.grad is not None))


def _grads(gen: torch.Generator) -> list[torch.Tensor]:
    """An embedding-sized matrix (2M entries, rows of unequal scale, as gradients have), a 3-D tensor,
    vectors, a scalar and an empty tensor."""
    big = torch.randn(8192, 256, generator=gen) * torch.rand(8192, 1, generator=gen) * 1e-3
    return [
        big,
        torch.randn(3, 5, 7, generator=gen),
        torch.randn(300, generator=gen) * 1e-2,
        torch.randn(1, generator=gen),
        torch.randn((), generator=gen),
        torch.zeros(0, 4),
    ]


def test_the_norm_is_the_float64_norm_rounded_to_float32():
    gen = torch.Generator().manual_seed(0)
    params = _params(*_grads(gen), None)  # the last has no gradient: it counts as zero
    norm = grad_norm(params)
    assert norm.dtype == torch.float32 and norm.shape == ()
    exact = _exact(params)
    # within one float32 rounding of the exact value (torch's CPU norm kernel, summing the 2M squares
    # in float32 accumulators, can be off by ~1e-4 on such a tensor: pytorch/pytorch#169237)
    assert abs(float(norm) - exact) <= 2 * torch.finfo(torch.float32).eps * exact, (float(norm), exact)
    assert float(grad_norm([])) == 0.0


def test_rows_split_over_tensors_give_the_same_norm_bit_for_bit():
    """What FSDP2 does to a gradient (dim-0 shards: first rows on one rank, the rest on another) does not
    change the norm: each row is reduced alike, and only the order of a float64 sum differs."""
    gen = torch.Generator().manual_seed(1)
    whole = _grads(gen)
    halves = [piece for g in whole[:3] for piece in g.chunk(2)]  # the matrix, the 3-D tensor, a vector
    assert torch.equal(grad_norm(_params(*whole)), grad_norm(_params(*halves, *whole[3:])))
    uneven = [piece for g in whole[:3] for piece in g.tensor_split(3)]
    assert torch.equal(grad_norm(_params(*whole)), grad_norm(_params(*uneven, *whole[3:])))


def test_clip_scales_like_torch_and_returns_the_norm_before():
    gen = torch.Generator().manual_seed(2)
    grads = [torch.randn(64, 32, generator=gen), torch.randn(32, generator=gen)]  # small: torch is exact
    mine, theirs = _params(*(g.clone() for g in grads)), _params(*(g.clone() for g in grads))
    norm = clip_grad_norm_(mine, 1.0)
    want = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert float(norm) > 1.0 and abs(float(norm) - float(want)) <= 1e-6 * float(want)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)
    assert abs(float(grad_norm(mine)) - 1.0) < 1e-6  # clipped to max_norm

    untouched = _params(*(g.clone() for g in grads))
    assert torch.equal(clip_grad_norm_(untouched, math.inf), norm)  # no clip: the norm, grads as they were
    assert torch.equal(clip_grad_norm_(untouched, 1e9), norm)
    assert all(torch.equal(p.grad, g) for p, g in zip(untouched, grads, strict=True))


def test_a_nonfinite_gradient_gives_a_nonfinite_norm():
    """The trainer skips the step on a non-finite norm: no inf or NaN may be hidden by the sum."""
    for bad in (math.inf, math.nan):
        g = torch.ones(16, 8)
        g[3, 5] = bad
        params = _params(g, torch.ones(4))
        assert not math.isfinite(float(grad_norm(params)))
        assert not math.isfinite(float(clip_grad_norm_(params, 1.0)))


def test_float64_gradients_get_a_float64_norm_and_clip():
    # a float64 run (the reference-loop comparison) must not clip with a float32-rounded norm
    g = torch.randn(300, 70, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    p = torch.zeros_like(g, requires_grad=True)
    p.grad = g.clone()
    norm = clip_grad_norm_([p], max_norm=1.0)
    assert norm.dtype == torch.float64
    assert abs(norm.item() - g.norm().item()) <= 1e-12 * g.norm().item()
    torch.testing.assert_close(p.grad, g * (1.0 / (g.norm() + 1e-6)), rtol=1e-14, atol=0)
