"""MARS against the plain reference of docs/algorithms.md sections 1, 2 and 5, and its special cases."""

from __future__ import annotations

import math

import optim_reference as ref
import pytest
import torch
from optim_helpers import (
    STEPS,
    displacement_err,
    gradient_sequence,
    make_params,
    previous_grads,
    rel_err,
    run_ours,
)

from mars.optim import MARS, Lion

# True: the compiled kernels (what fused=None gives on a GPU, and on the CPU for large buckets), False: the
# multi-tensor path (what fused=None gives on the CPU for small tensors, as here).
IMPLS = [pytest.param(True, id="compiled"), pytest.param(False, id="foreach")]
HP = dict(
    lr=1e-2,
    betas=(0.95, 0.99),
    eps=1e-8,
    weight_decay=0.1,
    gamma=0.025,
    lr_1d=5e-3,
    betas_1d=(0.9, 0.95),
    weight_decay_1d=0.1,
)
SHAPES_2D = [(6, 5), (40, 30)]


def reference_run(
    params0,
    grads,
    stashes,
    *,
    mars_type,
    clip=True,
    optimize_1d=False,
    two_dim_rule="eq2",
    amsgrad=False,
    gammas=None,
    hp=HP,
    c_fn=None,
):
    params = [p.clone() for p in params0]
    states = [{} for _ in params]
    for t, step_grads in enumerate(grads):
        gamma = hp["gamma"] if gammas is None else gammas[t]
        for i, (p, g) in enumerate(zip(params, step_grads, strict=True)):
            matrix = p.ndim == 2 if two_dim_rule == "eq2" else p.ndim >= 2
            if matrix or optimize_1d:
                ref.mars(
                    p,
                    g,
                    previous_grads(grads, stashes, t, i),
                    states[i],
                    mars_type=mars_type,
                    lr=hp["lr"],
                    betas=hp["betas"],
                    eps=hp["eps"],
                    wd=hp["weight_decay"],
                    gamma=gamma,
                    clip=clip,
                    matrix=matrix,
                    amsgrad=amsgrad,
                    c_fn=c_fn,
                )
            else:
                ref.adamw(
                    p,
                    g,
                    states[i],
                    lr=hp["lr_1d"],
                    betas=hp["betas_1d"],
                    eps=hp["eps"],
                    wd=hp["weight_decay_1d"],
                    amsgrad=amsgrad,
                )
    return params


def assert_matches(ours, expected, params0, *, ns_tensors=(), sign_tensors=()):
    for i, (a, e, s) in enumerate(zip(ours, expected, params0, strict=True)):
        if i in ns_tensors:  # Newton-Schulz runs in bfloat16
            assert displacement_err(a, e, s) < 5e-2, f"tensor {i} {tuple(s.shape)}"
        elif i in sign_tensors:
            assert_sign_update_matches(a, e, f"tensor {i} {tuple(s.shape)}")
        else:
            assert rel_err(a, e) < 1e-6, f"tensor {i} {tuple(s.shape)}: {rel_err(a, e):.2e}"


def assert_sign_update_matches(a, e, what: str) -> None:
    """MARS-Lion steps by sign(m): an entry of m within rounding of 0 may take the other sign when the
    clip's norm is summed in another order (the compiled kernels' reduction order depends on the
    thread count), moving that one entry by up to 2 lr per step. Every other entry must match to 1e-6,
    and such entries must stay rare."""
    diff = (a - e).abs()
    flipped = diff > 1e-6 * (1 + e.abs())
    assert flipped.float().mean() <= 1e-3, f"{what}: {int(flipped.sum())} of {a.numel()} entries differ"
    assert diff.max() <= 2 * HP["lr"] * STEPS, f"{what}: an entry moved {diff.max():.3g}"
    if flipped.any():
        assert rel_err(a[~flipped], e[~flipped]) < 1e-6, what


@pytest.mark.parametrize("fused", IMPLS)
@pytest.mark.parametrize("optimize_1d", [False, True], ids=["adamw1d", "opt1d"])
@pytest.mark.parametrize("clip", [True, False], ids=["clip", "noclip"])
@pytest.mark.parametrize("exact", [False, True], ids=["approx", "exact"])
@pytest.mark.parametrize("mars_type", ["mars-adamw", "mars-lion", "mars-shampoo"])
def test_matches_reference(mars_type, exact, clip, optimize_1d, fused):
    params0, grads = make_params(), gradient_sequence()
    stashes = gradient_sequence(seed=3) if exact else None
    ours, opt = run_ours(
        lambda ps: MARS(
            ps,
            mars_type=mars_type,
            is_approx=not exact,
            clip_c=clip,
            optimize_1d=optimize_1d,
            fused=fused,
            **HP,
        ),
        params0,
        grads,
        stashes,
    )
    expected = reference_run(params0, grads, stashes, mars_type=mars_type, clip=clip, optimize_1d=optimize_1d)
    ns = {i for i, p in enumerate(params0) if p.ndim == 2} if mars_type == "mars-shampoo" else ()
    sign = (
        {i for i, p in enumerate(params0) if p.ndim == 2 or optimize_1d} if mars_type == "mars-lion" else ()
    )
    assert_matches(ours, expected, params0, ns_tensors=ns, sign_tensors=sign)
    assert opt.needs_previous_grads is exact


@pytest.mark.parametrize("fused", IMPLS)
@pytest.mark.parametrize("mars_type", ["mars-adamw", "mars-lion", "mars-shampoo"])
def test_ge2_rule_puts_3d_tensors_on_the_matrix_path(mars_type, fused):
    params0, grads = make_params(), gradient_sequence()
    ours, _ = run_ours(
        lambda ps: MARS(ps, mars_type=mars_type, two_dim_rule="ge2", fused=fused, **HP), params0, grads
    )
    expected = reference_run(params0, grads, None, mars_type=mars_type, two_dim_rule="ge2")
    ns = {i for i, p in enumerate(params0) if p.ndim >= 2} if mars_type == "mars-shampoo" else ()
    sign = {i for i, p in enumerate(params0) if p.ndim >= 2} if mars_type == "mars-lion" else ()
    assert_matches(ours, expected, params0, ns_tensors=ns, sign_tensors=sign)
    # under the default rule the 3-D tensor takes the 1-D AdamW path instead: results differ
    default, _ = run_ours(lambda ps: MARS(ps, mars_type=mars_type, fused=fused, **HP), params0, grads)
    assert rel_err(default[4], ours[4]) > 1e-3


def test_amsgrad_matches_reference():
    params0, grads = make_params(), gradient_sequence()
    ours, _ = run_ours(lambda ps: MARS(ps, amsgrad=True, **HP), params0, grads)
    assert_matches(ours, reference_run(params0, grads, None, mars_type="mars-adamw", amsgrad=True), params0)


@pytest.mark.parametrize("fused", IMPLS)
def test_gamma_is_read_from_the_param_group_every_step(fused):
    params0, grads = make_params(), gradient_sequence()
    gammas = [0.1 * t / STEPS for t in range(STEPS)]
    params = [torch.nn.Parameter(p.clone()) for p in params0]
    opt = MARS(params, fused=fused, **HP)
    for t, step_grads in enumerate(grads):
        opt.param_groups[0]["gamma"] = gammas[t]
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
    expected = reference_run(params0, grads, None, mars_type="mars-adamw", gammas=gammas)
    assert_matches([p.detach() for p in params], expected, params0)


@pytest.mark.parametrize("fused", IMPLS)
def test_first_step_clips_the_scaled_gradient(fused):
    """Step 1: g_prev = 0, so c_1 = (1 + gamma beta1/(1-beta1)) g_1, clipped, then one AdamW-form step."""
    lr, (b1, b2), eps, wd, gamma = 1e-2, (0.95, 0.99), 1e-8, 0.1, 0.025
    p0 = torch.randn(6, 5)
    for scale in (1.0, 1e-3):  # ||c_1|| > 1 (clipped) and < 1 (not)
        g = torch.randn(6, 5) * scale
        p = torch.nn.Parameter(p0.clone())
        p.grad = g.clone()
        MARS([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, gamma=gamma, fused=fused).step()
        c = (1 + gamma * b1 / (1 - b1)) * g
        assert (c.norm() > 1) == (scale == 1.0)
        c = c / max(c.norm().item(), 1.0)
        m, v = (1 - b1) * c, (1 - b2) * c * c
        expected = p0 - lr * (wd * p0 + m / ((v.sqrt() / math.sqrt(1 - b2) + eps) * (1 - b1)))
        assert rel_err(p.detach(), expected) < 1e-6


@pytest.mark.parametrize("fused", IMPLS)
def test_gamma_zero_without_clip_is_adamw(fused):
    params0, grads = make_params(SHAPES_2D), gradient_sequence(SHAPES_2D, scales=[1.0, 0.1])
    kw = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    ours, _ = run_ours(lambda ps: MARS(ps, gamma=0.0, clip_c=False, fused=fused, **kw), params0, grads)
    torch_adamw, _ = run_ours(lambda ps: torch.optim.AdamW(ps, **kw), params0, grads)
    for a, e in zip(ours, torch_adamw, strict=True):
        assert rel_err(a, e) < 1e-6


@pytest.mark.parametrize("fused", IMPLS)
def test_gamma_zero_without_clip_is_lion_with_equal_betas(fused):
    params0, grads = make_params(SHAPES_2D), gradient_sequence(SHAPES_2D, scales=[1.0, 0.1])
    ours, _ = run_ours(
        lambda ps: MARS(
            ps,
            mars_type="mars-lion",
            lr=1e-2,
            betas=(0.9, 0.99),
            weight_decay=0.1,
            gamma=0.0,
            clip_c=False,
            fused=fused,
        ),
        params0,
        grads,
    )
    lion, _ = run_ours(
        lambda ps: Lion(ps, lr=1e-2, betas=(0.9, 0.9), weight_decay=0.1, fused=fused), params0, grads
    )
    for a, e in zip(ours, lion, strict=True):
        assert rel_err(a, e) < 1e-6


@pytest.mark.parametrize("fused", IMPLS)
def test_exact_loop_uses_the_new_batch_gradient_at_the_previous_weights(fused):
    """The documented exact loop, checked against g_prev = grad f(x_{t-1}, xi_t) computed directly
    from a saved copy of the previous weights."""
    gen = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(16, 8, generator=gen), torch.randn(16, 3, generator=gen)) for _ in range(STEPS + 1)
    ]
    w0, b0 = torch.randn(3, 8, generator=gen), torch.randn(3, generator=gen)

    def loss_fn(w, b, batch):
        x, y = batch
        return ((x @ w.T + b - y) ** 2).mean()

    w, b = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(b0.clone())
    opt = MARS([w, b], is_approx=False, fused=fused, **HP)
    for t in range(STEPS):
        loss_fn(w, b, batches[t + 1]).backward()  # grad f(x_t, xi_{t+1})
        opt.stash_previous_grads()
        opt.zero_grad(set_to_none=True)
        loss_fn(w, b, batches[t]).backward()  # grad f(x_t, xi_t)
        opt.step()
        opt.zero_grad(set_to_none=True)

    rw, rb = w0.clone(), b0.clone()
    sw, sb, prev = {}, {}, None
    for t in range(STEPS):
        rw_, rb_ = rw.clone().requires_grad_(), rb.clone().requires_grad_()
        gw, gb = torch.autograd.grad(loss_fn(rw_, rb_, batches[t]), (rw_, rb_))
        if prev is None:
            gpw = torch.zeros_like(rw)
        else:
            pw, pb = prev[0].clone().requires_grad_(), prev[1].clone().requires_grad_()
            gpw, _ = torch.autograd.grad(loss_fn(pw, pb, batches[t]), (pw, pb))
        prev = (rw.clone(), rb.clone())
        ref.mars(
            rw,
            gw,
            gpw,
            sw,
            mars_type="mars-adamw",
            lr=HP["lr"],
            betas=HP["betas"],
            eps=HP["eps"],
            wd=HP["weight_decay"],
            gamma=HP["gamma"],
            clip=True,
            matrix=True,
        )
        ref.adamw(rb, gb, sb, lr=HP["lr_1d"], betas=HP["betas_1d"], eps=HP["eps"], wd=HP["weight_decay_1d"])
    assert rel_err(w.detach(), rw) < 1e-6
    assert rel_err(b.detach(), rb) < 1e-6


def test_exact_step_without_stash_is_an_error_and_approx_stash_too():
    p = torch.nn.Parameter(torch.randn(4, 3))
    p.grad = torch.randn(4, 3)
    with pytest.raises(RuntimeError, match="stash_previous_grads"):
        MARS([p], is_approx=False).step()
    with pytest.raises(RuntimeError, match="exact mode only"):
        MARS([p]).stash_previous_grads()


def test_reference_method_names_run_the_reference_exact_loop():
    """update_previous_grad() before step(), update_last_grad() after it: same as the contract loop."""
    params0, grads = make_params(), gradient_sequence()
    stashes = gradient_sequence(seed=3)
    expected, _ = run_ours(lambda ps: MARS(ps, is_approx=False, **HP), params0, grads, stashes)
    params = [torch.nn.Parameter(p.clone()) for p in params0]
    opt = MARS(params, is_approx=False, **HP)
    for t in range(STEPS):
        for p, s in zip(params, stashes[t], strict=True):
            p.grad = s.clone()
        opt.update_previous_grad()
        opt.zero_grad(set_to_none=True)
        for p, g in zip(params, grads[t], strict=True):
            p.grad = g.clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        opt.update_last_grad()
    for a, e in zip(params, expected, strict=True):
        assert torch.equal(a.detach(), e)


@pytest.mark.parametrize("fused", IMPLS)
def test_approx_keeps_a_copy_not_a_reference_to_grad(fused):
    """Zeroing p.grad in place (set_to_none=False) must not erase g_prev."""
    params0, grads = make_params(), gradient_sequence()
    params = [torch.nn.Parameter(p.clone()) for p in params0]
    opt = MARS(params, fused=fused, **HP)
    for p in params:
        p.grad = torch.zeros_like(p)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad.copy_(g)
        opt.step()
        opt.zero_grad(set_to_none=False)
    expected = reference_run(params0, grads, None, mars_type="mars-adamw")
    assert_matches([p.detach() for p in params], expected, params0)


def test_default_path_compiles_large_cpu_buckets_only(monkeypatch):
    from mars.optim import _kernels

    big, small = torch.zeros(256, 160), torch.zeros(5)
    assert small.numel() < _kernels.FUSED_MIN_NUMEL <= big.numel() < _kernels.CPU_COMPILE_MIN_NUMEL
    if not _kernels.available(big.device):
        assert _kernels.compiled_indices(None, [[big, small]]) == []
        return
    # on the CPU a bucket this small is not worth compiling (seconds per process)...
    assert _kernels.compiled_indices(None, [[big, small]]) == []
    assert _kernels.compiled_indices(True, [[big, small]]) == [0]  # ...unless asked to: fused=True
    # ...and one of CPU_COMPILE_MIN_NUMEL entries is (here: the threshold lowered to this bucket's size)
    monkeypatch.setattr(_kernels, "CPU_COMPILE_MIN_NUMEL", big.numel())
    assert _kernels.compiled_indices(None, [[big, small]]) == [0]  # the small tensor: multi-tensor
    assert _kernels.compiled_indices(False, [[big, small]]) == []
    assert _kernels.compiled_indices(None, [[big.t(), small]]) == []  # not contiguous
    p, q = torch.nn.Parameter(torch.randn(256, 160)), torch.nn.Parameter(torch.randn(5))
    p.grad, q.grad = torch.randn(256, 160), torch.randn(5)
    MARS([p, q], optimize_1d=True).step()
    compiled = {k.name for k in _kernels._KERNELS.values() if k._compiled is not None}
    assert "mars_adamw" in compiled  # c clipped by its own norm inside the kernel


def test_mars_optim_fused_0_makes_the_multi_tensor_path_the_default(monkeypatch):
    from mars.optim import _kernels

    big = torch.zeros(256, 160)
    monkeypatch.setenv(_kernels.DEFAULT_ENV, "0")
    assert _kernels.compiled_indices(None, [[big]]) == []
    if _kernels.available(big.device):
        assert _kernels.compiled_indices(True, [[big]]) == [0]  # an explicit fused=True still compiles
