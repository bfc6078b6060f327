"""The batched Newton-Schulz: the iteration algebra in float64, orthogonality, batching, errors."""

from __future__ import annotations

import optim_reference as ref
import pytest
import torch

from mars.optim import newton_schulz
from mars.optim.newton_schulz import _iterate, orthogonalize_


def literal_reference(X, steps):
    for _ in range(steps):
        A = X @ X.mT
        B = A @ X
        X = ref.A * X + ref.B * B + ref.C * A @ B
    return X


def literal_moonlight(X, steps):
    for _ in range(steps):
        A = X @ X.mT
        B = ref.B * A + ref.C * A @ A
        X = ref.A * X + B @ X
    return X


@pytest.mark.parametrize("form,literal", [("reference", literal_reference), ("moonlight", literal_moonlight)])
def test_iteration_is_the_spec_polynomial(form, literal):
    """Run in float64 so that only the algebra (not bf16 rounding) is compared."""
    X = torch.randn(3, 5, 9, dtype=torch.float64)
    X = X / X.norm(dim=(-2, -1), keepdim=True)
    torch.testing.assert_close(_iterate(X.clone(), 5, form), literal(X, 5), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("form", ["reference", "moonlight"])
@pytest.mark.parametrize("shape", [(64, 24), (24, 64), (32, 32)])
def test_output_is_nearly_orthogonal(shape, form):
    """Quintic NS maps singular values spanning 1..0.03 of the largest into roughly [0.6, 1.2]
    (spec: U S' V^T with S' ~ 1), keeping M's singular vectors."""
    k = min(shape)
    U, _ = torch.linalg.qr(torch.randn(shape[0], k))
    V, _ = torch.linalg.qr(torch.randn(shape[1], k))
    M = U @ torch.diag(torch.logspace(0, -1.5, k)) @ V.T
    O = newton_schulz(M, form=form).float()
    assert O.shape == M.shape and newton_schulz(M).dtype == torch.bfloat16
    s = torch.linalg.svdvals(O)
    assert s.min() > 0.5 and s.max() < 1.3, s
    assert ((O - U @ V.T).norm() / (U @ V.T).norm()) < 0.3


def test_reference_form_matches_the_plain_reference():
    for shape in [(6, 5), (4, 7), (40, 30)]:
        M = torch.randn(shape)
        ours, expected = newton_schulz(M, eps=1e-8).float(), ref.ns_reference(M, 1e-8)
        assert (ours - expected).norm() / expected.norm() < 0.08  # two bf16 computations, ~4% each from f64


def test_batch_equals_one_at_a_time():
    M = torch.randn(4, 12, 20)
    batched = orthogonalize_(M.bfloat16(), steps=5, eps=1e-7, form="moonlight").float()
    single = torch.stack([newton_schulz(m, form="moonlight") for m in M]).float()
    assert ((batched - single).norm() / single.norm()) < 2e-2


def test_bad_input_is_an_error():
    with pytest.raises(ValueError, match="form"):
        newton_schulz(torch.randn(3, 3), form="svd")
    with pytest.raises(ValueError, match="matrix"):
        newton_schulz(torch.randn(3))
