"""The optimizers on CUDA: compiled Triton kernels (fused=True) against the multi-tensor path
(fused=False) on the same tensors, and bf16 parameters against a float32 run.

Uses only mars.optim's public API (no Hydra, no private kernel modules): that the compiled kernels
ran is read from torch.profiler (compiled regions; Triton kernels on CUDA) and from the absence of the
fallback warning. Every class of mars.optim is covered: MARS (mars-adamw,
mars-lion, mars-shampoo; approximate and exact; clip on and off; optimize_1d), MARSM (approximate,
exact, lean), Lion, Muon and Moonlight (with and without Nesterov).

Tolerances. The update kernels compute in float32 in both implementations, so the states (which
depend only on the gradients) agree to float32 rounding: max |a - b| / max |b| < 1e-5. So do the
parameters of the elementwise optimizers. Sign-based ones (Lion, MARS-Lion) may flip the sign of an
entry whose momentum rounds to ~0 differently: at most 0.1% of the entries may differ. The
Newton-Schulz optimizers orthogonalise in bfloat16, and the two paths may round the momentum into
that bfloat16 input differently (once vs twice): their matrices must agree to 3% of the distance they
moved (1.1% measured on the CPU, where the float32 states agree bit for bit).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from cuda_helpers import DEVICE, ON_CUDA, fused_fallbacks, profiled, sync

from mars.optim import MARS, MARSM, Lion, Moonlight, Muon

pytestmark = pytest.mark.cuda

STEPS = 5
# Matrices: four with >= 32768 entries, large enough for the compiled kernels, two of one shape (one
# batched Newton-Schulz), one odd shape, one small matrix (the multi-tensor path takes small tensors).
MATRICES = [(384, 256), (384, 256), (256, 384), (300, 130), (64, 48)]
# The rest: an embedding-like matrix (the AdamW side of Muon, Moonlight and MARS-M; a MARS matrix),
# a large 1-D tensor (compiled AdamW kernel) and two small ones.
OTHERS = [(512, 96), (40000,), (1024,), (48,)]
SHAPES = MATRICES + OTHERS
# Gradient scales: some tensors' c is clipped (norm > 1), others are not.
SCALES = [1.0, 1e-3, 0.02, 1e-3, 0.05, 1e-3, 0.01, 0.1, 0.3]
PARAM_SCALE = 0.05
BF16_PARAM_SCALE = 0.01
# bf16 vs float32 displacement error. Measured on the CPU: 0.7-1.6% for the elementwise optimizers,
# 2-4.8% for MARS-Lion / Lion (entries whose bf16 momentum rounds across 0 flip their sign) and
# the Newton-Schulz ones; a wrong dtype path gives errors of order 1.
BF16_TOL = {"elementwise": 0.05, "sign": 0.1, "ns": 0.1}


def _tensors(seed: int, scales) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen) * k for s, k in zip(SHAPES, scales, strict=True)]


PARAMS0 = _tensors(1, [PARAM_SCALE] * len(SHAPES))
# bf16 storage keeps 8 significant bits: an update of a few ulps is mostly rounding. Small start values
# (ulp <= 6e-5) keep the updates of these learning rates well above it.
BF16_PARAMS0 = _tensors(1, [BF16_PARAM_SCALE] * len(SHAPES))
GRADS = [_tensors(100 + t, SCALES) for t in range(STEPS)]
STASHES = [_tensors(200 + t, SCALES) for t in range(STEPS)]  # exact mode: grad f(x_t, xi_{t+1})


def _split(params):
    n = len(MATRICES)
    return [{"params": params[:n], "use_muon": True}, {"params": params[n:], "use_muon": False}]


def _mars(**kw):
    return lambda ps, fused: MARS(ps, lr=6e-3, lr_1d=3e-3, weight_decay=0.1, fused=fused, **kw)


def _matrix(cls, **kw):
    return lambda ps, fused: cls(_split(ps), fused=fused, **kw)


def _lion(ps, fused):
    return Lion(ps, lr=1e-3, weight_decay=0.1, fused=fused)


@dataclass(frozen=True)
class Case:
    make: Callable  # make(params, fused) -> optimizer
    kind: str  # elementwise | sign | ns: how closely the parameters must agree (module docstring)
    exact: bool = False  # exact mode: stash a look-ahead gradient before every step
    ns: tuple = ()  # indices of the tensors that are orthogonalised


NS_2D = tuple(i for i, s in enumerate(SHAPES) if len(s) == 2)  # MARS-Shampoo: every matrix
NS_MUON = tuple(range(len(MATRICES)))  # Muon, Moonlight, MARS-M: the hidden matrices
MARSM_KW = {"lr": 6e-3, "wd": 0.01}

CASES = {
    "mars_adamw": Case(_mars(), "elementwise"),
    "mars_adamw_noclip": Case(_mars(clip_c=False), "elementwise"),
    "mars_adamw_exact": Case(_mars(is_approx=False), "elementwise", exact=True),
    "mars_adamw_optimize_1d": Case(_mars(optimize_1d=True), "elementwise"),
    "mars_lion": Case(_mars(mars_type="mars-lion"), "sign"),
    "mars_lion_noclip": Case(_mars(mars_type="mars-lion", clip_c=False), "sign"),
    "mars_lion_exact": Case(_mars(mars_type="mars-lion", is_approx=False), "sign", exact=True),
    "mars_shampoo": Case(_mars(mars_type="mars-shampoo"), "ns", ns=NS_2D),
    "mars_shampoo_exact": Case(_mars(mars_type="mars-shampoo", is_approx=False), "ns", True, NS_2D),
    "mars_m": Case(_matrix(MARSM, **MARSM_KW), "ns", ns=NS_MUON),
    "mars_m_noclip": Case(_matrix(MARSM, **MARSM_KW, clip_c=False), "ns", ns=NS_MUON),
    "mars_m_exact": Case(_matrix(MARSM, **MARSM_KW, is_approx=False), "ns", True, NS_MUON),
    "mars_m_lean": Case(_matrix(MARSM, **MARSM_KW, lean=True), "ns", ns=NS_MUON),
    "lion": Case(_lion, "sign"),
    "muon": Case(_matrix(Muon, lr=0.02, weight_decay=0.01), "ns", ns=NS_MUON),
    "muon_no_nesterov": Case(_matrix(Muon, lr=0.02, nesterov=False), "ns", ns=NS_MUON),
    "moonlight": Case(_matrix(Moonlight, lr=6e-3, wd=0.1), "ns", ns=NS_MUON),
    "moonlight_nesterov": Case(_matrix(Moonlight, lr=6e-3, wd=0.1, nesterov=True), "ns", ns=NS_MUON),
}
BF16_CASES = ["mars_adamw", "mars_adamw_exact", "mars_lion", "mars_shampoo", "mars_m", "lion", "muon"]
BF16_CASES += ["moonlight"]


def run(make, fused, *, dtype=torch.float32, exact=False, inputs_dtype=None, params0=None):
    """STEPS steps from params0 (default PARAMS0) over the fixed gradients (exact mode: stash the
    look-ahead gradient first). inputs_dtype rounds the start values and gradients through that dtype
    first. Returns (params, optimizer, seconds of the first step)."""

    def prep(t):  # always a copy: the optimizer must not update PARAMS0 (or GRADS) in place
        if inputs_dtype is not None:
            t = t.to(inputs_dtype)
        return t.to(DEVICE, dtype, copy=True)

    params = [torch.nn.Parameter(prep(p)) for p in (PARAMS0 if params0 is None else params0)]
    opt = make(params, fused)
    first = 0.0
    for t in range(STEPS):
        sync()
        t0 = time.perf_counter()
        if exact:
            for p, s in zip(params, STASHES[t], strict=True):
                p.grad = prep(s)
            opt.stash_previous_grads()
        for p, g in zip(params, GRADS[t], strict=True):
            p.grad = prep(g)
        opt.step()
        sync()
        if t == 0:
            first = time.perf_counter() - t0
    return [p.detach() for p in params], opt, first


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def displacement_err(a: torch.Tensor, b: torch.Tensor, start: torch.Tensor) -> float:
    a, b, s = a.double(), b.double(), start.double().to(a.device)
    return ((a - b).norm() / (b - s).norm().clamp_min(1e-30)).item()


def state_err(opt_a, params_a, opt_b, params_b) -> float:
    worst = 0.0
    for pa, pb in zip(params_a, params_b, strict=True):
        sa, sb = opt_a.state[pa], opt_b.state[pb]
        assert sa.keys() == sb.keys()
        for key, va in sa.items():
            if torch.is_tensor(va) and va.is_floating_point() and va.numel() > 0:
                worst = max(worst, rel_err(va, sb[key]))
    return worst


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_kernels_match_the_multi_tensor_path(name, record, recwarn):
    case = CASES[name]
    kind, ns_idx = case.kind, case.ns
    (fused, opt_f, first_s), regions, triton = profiled(lambda: run(case.make, True, exact=case.exact))
    assert not fused_fallbacks(recwarn), fused_fallbacks(recwarn)
    assert regions > 0, "no compiled region ran: the fused path was not taken"
    if ON_CUDA:
        assert triton > 0, "no Triton kernel ran: the fused path was not compiled by Triton"
    ref, opt_r, _ = run(case.make, False, exact=case.exact)

    s_err = state_err(opt_f, fused, opt_r, ref)
    tight = [i for i in range(len(SHAPES)) if i not in ns_idx]
    p_err = max(rel_err(fused[i], ref[i]) for i in tight)
    ns_err = max((displacement_err(fused[i], ref[i], PARAMS0[i]) for i in ns_idx), default=0.0)
    flips = 0.0
    if kind == "sign":
        differ = [
            ((a - b).abs() > 1e-5 * b.abs().max()).sum().item() for a, b in zip(fused, ref, strict=True)
        ]
        flips = sum(differ) / sum(p.numel() for p in ref)
    record(
        state_err=s_err,
        param_err=p_err,
        ns_displacement_err=ns_err if ns_idx else None,
        sign_flip_fraction=flips if kind == "sign" else None,
        first_fused_step_s=round(first_s, 3),
        compiled_regions=regions,
        triton_kernels=triton if ON_CUDA else None,
    )
    assert s_err < 1e-5, f"optimizer state differs: {s_err:.2e}"
    if kind == "sign":
        assert flips <= 1e-3, f"{flips:.2%} of the entries differ"
    else:
        assert p_err < 1e-5, f"parameters differ: {p_err:.2e}"
    assert ns_err < 3e-2, f"orthogonalised matrices differ by {ns_err:.3f} of their displacement"


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
@pytest.mark.parametrize("name", BF16_CASES)
def test_bf16_parameters_follow_a_float32_run(name, fused, record, recwarn):
    """bf16 storage rounds every stored update (2^-8 relative): the result must stay within BF16_TOL
    of the float32 run's displacement, from the same (bf16-rounded) start and gradients."""
    case = CASES[name]
    ours, opt, _ = run(case.make, fused, dtype=torch.bfloat16, exact=case.exact, params0=BF16_PARAMS0)
    ref, _, _ = run(case.make, False, exact=case.exact, inputs_dtype=torch.bfloat16, params0=BF16_PARAMS0)
    assert not fused_fallbacks(recwarn), fused_fallbacks(recwarn)
    for p in ours:
        assert p.dtype == torch.bfloat16 and torch.isfinite(p).all()
    for state in opt.state.values():
        for key, v in state.items():
            if torch.is_tensor(v) and v.ndim > 0:
                assert v.dtype == torch.bfloat16, key
                assert torch.isfinite(v).all(), key
    start = [p.to(torch.bfloat16) for p in BF16_PARAMS0]
    errs = [displacement_err(a, b, s) for a, b, s in zip(ours, ref, start, strict=True)]
    record(max_displacement_err=max(errs))
    assert max(errs) < BF16_TOL[case.kind], [round(e, 4) for e in errs]


def test_fused_kernels_stayed_available(record, recwarn):
    """After everything above: fused=True is still accepted (an optimizer refuses it once a compile
    failure has switched the kernels off) and a step of the compiled kernels runs."""
    p = torch.nn.Parameter(torch.randn(512, 256, device=DEVICE))
    p.grad = torch.randn_like(p)
    opt = MARS([p], lr=1e-3, fused=True)
    _, regions, triton = profiled(lambda: (opt.step(), sync()))
    assert not fused_fallbacks(recwarn), fused_fallbacks(recwarn)
    record(device=DEVICE, compiled_regions=regions, triton_kernels=triton if ON_CUDA else None)
    assert regions > 0 and (triton > 0 or not ON_CUDA)
