"""Optimizer variants with another c_t, defined outside the package through its public extension point
(a MARS / MARSM subclass overriding the static method `correction`, registered with a config), against
the plain reference with that c_t; and the default c_t defined once for every optimizer that uses it."""

from __future__ import annotations

from dataclasses import dataclass

import optim_reference as ref
import pytest
import torch
from optim_helpers import TinyGPT, gradient_sequence, make_params, previous_grads, run_ours, set_random_grads
from test_mars import HP, IMPLS, assert_matches, reference_run
from test_matrix_optimizers import ADAMW, LR, MU, WD, run_reference, setup
from test_matrix_optimizers import assert_matches as assert_matrices_match
from test_matrix_optimizers import run_ours as run_matrix_optimizer

from mars.optim import MARS, MARSM, MARSConfig, build_optimizer, registry, rules


def plain(g, g_prev, gamma, beta):
    """A linear variant: the correction without the beta / (1 - beta) factor."""
    return g + (g - g_prev) * gamma


def squared(g, g_prev, gamma, beta):
    """A variant that is not linear in (g, g_prev)."""
    return g + (g - g_prev) * (g - g_prev) * (gamma * 50.0)


class MARSPlain(MARS):
    correction = staticmethod(plain)


class MARSSquared(MARS):
    correction = staticmethod(squared)


class MARSMPlain(MARSM):
    correction = staticmethod(plain)


class MARSMSquared(MARSM):
    correction = staticmethod(squared)


CASES = [
    ("mars-adamw", MARSPlain, plain),
    ("mars-lion", MARSPlain, plain),
    ("mars-shampoo", MARSPlain, plain),
    ("mars-adamw", MARSSquared, squared),
]


@pytest.mark.parametrize("fused", IMPLS)
@pytest.mark.parametrize("mars_type, cls, c_fn", CASES, ids=[f"{t}-{f.__name__}" for t, _, f in CASES])
def test_a_variant_c_t_is_used_everywhere_and_matches_the_reference(mars_type, cls, c_fn, fused):
    params0, grads = make_params(), gradient_sequence()
    ours, _ = run_ours(lambda ps: cls(ps, mars_type=mars_type, fused=fused, **HP), params0, grads)
    expected = reference_run(params0, grads, None, mars_type=mars_type, c_fn=c_fn)
    ns = {i for i, p in enumerate(params0) if p.ndim == 2} if mars_type == "mars-shampoo" else ()
    sign = {i for i, p in enumerate(params0) if p.ndim == 2} if mars_type == "mars-lion" else ()
    assert_matches(ours, expected, params0, ns_tensors=ns, sign_tensors=sign)
    default = reference_run(params0, grads, None, mars_type=mars_type)
    assert any((a - e).abs().max() > 1e-4 for a, e in zip(ours, default, strict=True))  # c_t mattered


@pytest.mark.parametrize("fused", IMPLS)
def test_a_variant_c_t_reaches_mars_m_and_its_lean_form(fused):
    params0, grads = setup()
    gamma = 0.1
    full = run_matrix_optimizer(
        lambda g: MARSMPlain(g, lr=LR, weight_decay=WD, gamma=gamma, fused=fused), params0, grads
    )
    expected = run_reference(
        lambda t, i, p, g, st: ref.mars_m(
            p,
            g,
            previous_grads(grads, None, t, i),
            st,
            lr=LR,
            momentum=MU,
            gamma=gamma,
            clip=True,
            wd=WD,
            c_fn=plain,
        ),
        params0,
        grads,
        adamw=dict(ADAMW, lr=LR, wd=WD),
        eps_form="moonlight",
    )
    assert_matrices_match(full, expected, params0)
    # the lean form is derived from the variant's c_t: algebraically its unclipped approximate MARS-M
    unclipped = run_matrix_optimizer(
        lambda g: MARSMPlain(g, lr=LR, weight_decay=WD, gamma=gamma, clip_c=False, fused=fused),
        params0,
        grads,
    )
    lean = run_matrix_optimizer(
        lambda g: MARSMPlain(g, lr=LR, weight_decay=WD, gamma=gamma, lean=True, fused=fused), params0, grads
    )
    assert_matrices_match(lean, unclipped, params0, tol=2e-2)
    default_lean = run_matrix_optimizer(
        lambda g: MARSM(g, lr=LR, weight_decay=WD, gamma=gamma, lean=True, fused=fused), params0, grads
    )
    assert max((a - b).abs().max().item() for a, b in zip(lean, default_lean, strict=True)) > 1e-4


def test_the_default_c_t_is_one_function_and_the_lean_form_follows_it():
    assert MARS.correction is rules.correction and MARSM.correction is rules.correction
    gamma, mu = 0.025, 0.95
    a, b = rules.lean_coefficients(rules.correction, gamma, mu)
    assert a == pytest.approx(gamma, rel=1e-12) and b == pytest.approx((1 - gamma) * (1 - mu) / mu, rel=1e-12)
    assert rules.is_linear(rules.correction) and rules.is_linear(plain) and not rules.is_linear(squared)


def test_a_lean_form_of_a_nonlinear_c_t_is_refused_in_one_line():
    w = torch.nn.Parameter(torch.randn(4, 3))
    with pytest.raises(
        ValueError, match=r"lean=True with MARSMSquared.correction: .* linear in \(g, g_prev\)"
    ):
        MARSMSquared([w], lean=True)
    MARSMSquared([w])  # the full form takes any c_t


def test_the_correction_must_be_a_static_method():
    class Bound(MARS):
        def correction(self, g, g_prev, gamma, beta):
            return g

    with pytest.raises(TypeError, match=r"Bound.correction must be a @staticmethod"):
        Bound([torch.nn.Parameter(torch.randn(3, 3))])


@dataclass
class MARSPlainConfig(MARSConfig):
    name: str = "mars_plain_test"


def test_a_registered_variant_builds_and_trains_by_name(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # leave no trace
    registry.register(
        "mars_plain_test",
        MARSPlainConfig,
        MARSPlain,
        grouping="decay",
        trainer_keys=("gamma_schedule",),
        fixed={"mars_type": "mars-adamw"},
    )
    model = TinyGPT()
    opt = build_optimizer(model, {"name": "mars_plain_test", "lr": 1e-3, "fused": False})
    assert type(opt) is MARSPlain and opt.param_groups[0]["mars_type"] == "mars-adamw"
    assert opt.param_groups[0]["lr"] == 1e-3 and opt.param_groups[1]["weight_decay"] == 0.0
    before = [p.detach().clone() for p in model.parameters()]
    for seed in range(2):
        set_random_grads(model, seed)
        opt.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    # the variant's groups are the same layout as MARS-AdamW's (and its state dict loads back)
    reference = build_optimizer(TinyGPT(), {"name": "mars_adamw", "lr": 1e-3, "fused": False})
    assert [sorted(g) for g in opt.param_groups] == [sorted(g) for g in reference.param_groups]
    opt.load_state_dict(opt.state_dict())
