"""Muon, Moonlight and MARS-M against the plain reference (docs/algorithms.md sections 3 and 4)."""

from __future__ import annotations

import optim_reference as ref
import pytest
import torch
from optim_helpers import STEPS, displacement_err, previous_grads, rel_err

from mars.optim import MARSM, Moonlight, Muon

IMPLS = [pytest.param(True, id="compiled"), pytest.param(False, id="foreach")]
# hidden matrices (wide, tall, and one large enough for the compiled kernels) take the orthogonalised
# step; a 1-D tensor and two embedding-like matrices (one large) take AdamW.
MATRICES = [(6, 5), (4, 7), (192, 176)]
OTHERS = [(5,), (9, 3), (300, 128)]
SCALES = [1.0, 0.05, 0.01, 0.3, 0.1, 0.01]
LR, WD, MU = 2e-2, 0.1, 0.95
ADAMW = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, wd=0.1)


def setup(seed=2):
    gen = torch.Generator().manual_seed(1)
    params0 = [torch.randn(s, generator=gen) for s in MATRICES + OTHERS]
    gen = torch.Generator().manual_seed(seed)
    grads = [
        [torch.randn(s, generator=gen) * k for s, k in zip(MATRICES + OTHERS, SCALES, strict=True)]
        for _ in range(STEPS)
    ]
    return params0, grads


def groups(params):
    n = len(MATRICES)
    return [{"params": params[:n], "use_muon": True}, {"params": params[n:], "use_muon": False}]


def run_ours(make_opt, params0, grads, stashes=None):
    params = [torch.nn.Parameter(p.clone()) for p in params0]
    opt = make_opt(groups(params))
    for t in range(STEPS):
        if stashes is not None:
            for p, s in zip(params, stashes[t], strict=True):
                p.grad = s.clone()
            opt.stash_previous_grads()
        for p, g in zip(params, grads[t], strict=True):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in params]


def run_reference(matrix_update, params0, grads, *, adamw=ADAMW, eps_form="torch"):
    """matrix_update(t, i, p, g, state) for the matrices; AdamW for the rest."""
    params = [p.clone() for p in params0]
    states = [{} for _ in params]
    for t in range(STEPS):
        for i, (p, g) in enumerate(zip(params, grads[t], strict=True)):
            if i < len(MATRICES):
                matrix_update(t, i, p, g, states[i])
            else:
                ref.adamw(
                    p,
                    g,
                    states[i],
                    lr=adamw["lr"],
                    betas=adamw["betas"],
                    eps=adamw["eps"],
                    wd=adamw["wd"],
                    eps_form=eps_form,
                )
    return params


def assert_matches(ours, expected, params0, tol=5e-2):
    """Matrices within bfloat16 Newton-Schulz tolerance of the reference (whose own bf16 result is
    3-4% from a float64 one per step), AdamW tensors to 1e-6."""
    for i, (a, e, s) in enumerate(zip(ours, expected, params0, strict=True)):
        if i < len(MATRICES):
            assert displacement_err(a, e, s) < tol, (
                f"matrix {i} {tuple(s.shape)}: {displacement_err(a, e, s):.3f}"
            )
        else:
            assert rel_err(a, e) < 1e-6, f"tensor {i} {tuple(s.shape)}"


@pytest.mark.parametrize("fused", IMPLS)
@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_matches_reference(nesterov, fused):
    params0, grads = setup()
    ours = run_ours(
        lambda g: Muon(
            g,
            lr=LR,
            momentum=MU,
            nesterov=nesterov,
            weight_decay=WD,
            adamw_lr=ADAMW["lr"],
            adamw_wd=ADAMW["wd"],
            fused=fused,
        ),
        params0,
        grads,
    )
    expected = run_reference(
        lambda t, i, p, g, st: ref.muon(p, g, st, lr=LR, momentum=MU, nesterov=nesterov, wd=WD),
        params0,
        grads,
    )
    assert_matches(ours, expected, params0)


@pytest.mark.parametrize("fused", IMPLS)
@pytest.mark.parametrize("nesterov", [False, True])
def test_moonlight_matches_reference(nesterov, fused):
    params0, grads = setup()
    ours = run_ours(
        lambda g: Moonlight(g, lr=LR, wd=WD, momentum=MU, nesterov=nesterov, fused=fused), params0, grads
    )
    expected = run_reference(
        lambda t, i, p, g, st: ref.moonlight(p, g, st, lr=LR, momentum=MU, nesterov=nesterov, wd=WD),
        params0,
        grads,
        adamw=dict(ADAMW, lr=LR, wd=WD),
        eps_form="moonlight",
    )
    assert_matches(ours, expected, params0)


@pytest.mark.parametrize("fused", IMPLS)
@pytest.mark.parametrize("clip", [True, False], ids=["clip", "noclip"])
@pytest.mark.parametrize("exact", [False, True], ids=["approx", "exact"])
def test_mars_m_matches_reference(exact, clip, fused):
    params0, grads = setup()
    stashes = setup(seed=3)[1] if exact else None
    gamma = 0.025
    ours = run_ours(
        lambda g: MARSM(
            g, lr=LR, wd=WD, momentum=MU, gamma=gamma, clip_c=clip, is_approx=not exact, fused=fused
        ),
        params0,
        grads,
        stashes,
    )
    expected = run_reference(
        lambda t, i, p, g, st: ref.mars_m(
            p, g, previous_grads(grads, stashes, t, i), st, lr=LR, momentum=MU, gamma=gamma, clip=clip, wd=WD
        ),
        params0,
        grads,
        adamw=dict(ADAMW, lr=LR, wd=WD),
        eps_form="moonlight",
    )
    assert_matches(ours, expected, params0)


@pytest.mark.parametrize("fused", IMPLS)
def test_lean_mars_m_equals_unclipped_approximate_mars_m(fused):
    params0, grads = setup()
    gamma = 0.1
    lean = run_ours(lambda g: MARSM(g, lr=LR, wd=WD, gamma=gamma, lean=True, fused=fused), params0, grads)
    full = run_ours(lambda g: MARSM(g, lr=LR, wd=WD, gamma=gamma, clip_c=False, fused=fused), params0, grads)
    # algebraically identical; only bfloat16 rounding of the Newton-Schulz input differs
    assert_matches(lean, full, params0, tol=2e-2)
    expected = run_reference(
        lambda t, i, p, g, st: ref.mars_m_lean(p, g, st, lr=LR, momentum=MU, gamma=gamma, wd=WD),
        params0,
        grads,
        adamw=dict(ADAMW, lr=LR, wd=WD),
        eps_form="moonlight",
    )
    assert_matches(lean, expected, params0)


@pytest.mark.parametrize("fused", IMPLS)
def test_mars_m_with_gamma_zero_and_no_clip_is_moonlight(fused):
    params0, grads = setup()
    mars_m = run_ours(lambda g: MARSM(g, lr=LR, wd=WD, gamma=0.0, clip_c=False, fused=fused), params0, grads)
    moonlight = run_ours(lambda g: Moonlight(g, lr=LR, wd=WD, fused=fused), params0, grads)
    for a, e in zip(mars_m, moonlight, strict=True):
        assert rel_err(a, e) < 1e-6


def test_reference_keyword_forms_equal_param_groups():
    params0, grads = setup()

    def keyword(cls, **kw):
        def make(group_list):
            return cls(muon_params=group_list[0]["params"], adamw_params=group_list[1]["params"], **kw)

        return make

    for cls, kw in [
        (
            MARSM,
            dict(
                lr=LR,
                wd=WD,
                momentum=MU,
                ns_steps=5,
                adamw_betas=(0.9, 0.95),
                adamw_eps=1e-8,
                gamma=0.025,
                clip_c=True,
                is_approx=True,
            ),
        ),
        (
            Moonlight,
            dict(
                lr=LR, wd=WD, momentum=MU, nesterov=False, ns_steps=5, adamw_betas=(0.9, 0.95), adamw_eps=1e-8
            ),
        ),
        (Muon, dict(lr=LR, momentum=MU, adamw_lr=3e-3)),
    ]:
        a = run_ours(keyword(cls, **kw), params0, grads)
        b = run_ours(lambda g, cls=cls, kw=kw: cls(g, **kw), params0, grads)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), cls.__name__
    with pytest.raises(ValueError, match="not both"):
        MARSM([torch.nn.Parameter(torch.randn(3, 3))], muon_params=[torch.nn.Parameter(torch.randn(3, 3))])
    with pytest.raises(ValueError, match="no parameters"):
        Moonlight()


def test_group_without_use_muon_is_split_by_ndim():
    w, b = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(4))
    opt = Muon([w, b], lr=0.02, adamw_lr=1e-3, adamw_wd=0.05)
    (g1,), (g2,) = [[g for g in opt.param_groups if g["use_muon"] is flag] for flag in (True, False)]
    assert g1["params"] == [w] and g1["lr"] == 0.02
    assert g2["params"] == [b] and g2["lr"] == 1e-3 and g2["weight_decay"] == 0.05
    # the reference's "wd" group key is accepted
    opt = MARSM([{"params": [w], "use_muon": True, "wd": 0.3}])
    assert opt.param_groups[0]["weight_decay"] == 0.3


def test_one_dim_tensor_in_a_muon_group_takes_adamw():
    w, b = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(4))
    opt = Moonlight([{"params": [w, b], "use_muon": True}], lr=1e-2)
    w.grad, b.grad = torch.randn(4, 3), torch.randn(4)
    opt.step()
    assert set(opt.state[w]) == {"momentum_buffer"}
    assert set(opt.state[b]) == {"exp_avg", "exp_avg_sq", "step"}
