"""MARS diagnostics (docs/algorithms.md section 8): equal to a plain recomputation from the gradients,
and the updates are the same with them on or off."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from optim_helpers import TinyGPT

from mars.optim import build_optimizer

GAMMA, BETA = 0.05, 0.95
K = GAMMA * BETA / (1 - BETA)


def gradient_sequence(model, steps: int, seed: int = 0):
    """Per step, a gradient per parameter; matrices alternately scaled by 0.002 and 1, so that c is
    clipped on some tensors and not on others."""
    gen = torch.Generator().manual_seed(seed)
    matrix_index = {}
    for p in model.parameters():
        if p.ndim == 2:
            matrix_index[id(p)] = len(matrix_index)
    scale = [0.002 if matrix_index.get(id(p), 0) % 2 else 1.0 for p in model.parameters()]
    return [
        [torch.randn(p.shape, generator=gen) * s for p, s in zip(model.parameters(), scale, strict=True)]
        for _ in range(steps)
    ]


def plain_figures(sequence, on_path) -> dict[str, float]:
    """The diagnostics computed directly from the gradients: approximate mode, g_prev = last step's g."""
    per_step = []
    prev = None
    for grads in sequence:
        gs = [g.double() for g, keep in zip(grads, on_path, strict=True) if keep]
        ps = [torch.zeros_like(g) for g in gs] if prev is None else prev
        norms = [torch.linalg.vector_norm(g + K * (g - p)).item() for g, p in zip(gs, ps, strict=True)]
        g2 = sum((g * g).sum().item() for g in gs)
        p2 = sum((p * p).sum().item() for p in ps)
        dot = sum((g * p).sum().item() for g, p in zip(gs, ps, strict=True))
        diff2 = sum(((K * (g - p)) ** 2).sum().item() for g, p in zip(gs, ps, strict=True))
        cos = dot / math.sqrt(g2 * p2) if g2 * p2 > 0 else 0.0
        per_step.append(
            (
                sum(norms) / len(norms),
                max(norms),
                sum(n > 1 for n in norms) / len(norms),
                cos,
                math.sqrt(diff2 / g2),
            )
        )
        prev = gs
    n = len(per_step)
    return {
        "mars/c_norm_mean": sum(s[0] for s in per_step) / n,
        "mars/c_norm_max": max(s[1] for s in per_step),
        "mars/clip_fraction": sum(s[2] for s in per_step) / n,
        "mars/grad_cos": sum(s[3] for s in per_step) / n,
        "mars/correction_ratio": sum(s[4] for s in per_step) / n,
    }


CASES = [
    ({"name": "mars_adamw"}, lambda p: p.ndim == 2),
    ({"name": "mars_lion"}, lambda p: p.ndim == 2),
    ({"name": "mars_shampoo"}, lambda p: p.ndim == 2),
    ({"name": "mars_m"}, None),  # the hidden matrices (use_muon groups)
]


@pytest.mark.parametrize("fused", [True, False], ids=["compiled", "foreach"])
@pytest.mark.parametrize("cfg, mars_tensor", CASES, ids=[c[0]["name"] for c in CASES])
def test_diagnostics_equal_a_plain_recomputation_and_change_nothing(cfg, mars_tensor, fused):
    torch.manual_seed(0)
    model = TinyGPT(bias=True)
    twin = copy.deepcopy(model)
    keys = {"gamma": GAMMA, "fused": fused, **({"momentum": BETA} if cfg["name"] == "mars_m" else {})}
    on = build_optimizer(model, {**cfg, **keys, "diagnostics": True})
    off = build_optimizer(twin, {**cfg, **keys})
    if mars_tensor is None:
        hidden = {id(p) for g in on.param_groups if g["use_muon"] for p in g["params"] if p.ndim >= 2}
        on_path = [id(p) in hidden for p in model.parameters()]
    else:
        on_path = [mars_tensor(p) for p in model.parameters()]
    sequence = gradient_sequence(model, 3)
    for grads in sequence:
        for opt, m in ((on, model), (off, twin)):
            for p, g in zip(m.parameters(), grads, strict=True):
                p.grad = g.clone()
            opt.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b)  # diagnostics do not touch the update
    got = on.read_diagnostics()
    want = plain_figures(sequence, on_path)
    assert 0 < want["mars/clip_fraction"] < 1  # some tensors clipped, some not
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=2e-5, abs=1e-6), key
    assert on.read_diagnostics() == {}  # read resets
    assert off.read_diagnostics() == {}
