"""The torch.optim contract: the properties torch's own optimizer tests check, for MARS, MARSM, Lion,
Muon and Moonlight.

Adapted (not copied) from the list of properties in torch's test/test_optim.py: copies and pickles
that keep working, deterministic state-dict round trips (torch.save / torch.load(weights_only=True)),
older state dicts, named parameters, hooks, lr schedulers, param groups, no-op steps, descent, plus
what is specific to these optimizers: refusing another optimizer's state, float64 precision of the
fused kernels, and torch.compile of a whole training step.

torch.compile tests use backend="aot_eager" (Dynamo + AOTAutograd, the traced graph run op by op:
it checks what can break, tracing, guards and recompiles, at ~1 s a graph) for most classes, and
the default Inductor backend for MARS-AdamW and Muon (the elementwise and the Newton-Schulz
kinds), where it costs several seconds a graph on CPU. They run under an lr schedule that changes
lr at every step and fail on any recompile after the warm-up steps.
"""

from __future__ import annotations

import copy
import io
import pickle

import optim_reference as ref
import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from mars.optim import MARS, MARSM, Lion, Moonlight, Muon, keep_lr_1d_ratio, set_lr_factor
from mars.optim._contract import RECORD_KEY

MAKERS = {
    "mars_adamw": lambda ps, **kw: MARS(ps, lr=1e-2, lr_1d=1e-2, weight_decay=0.1, **kw),
    "mars_lion": lambda ps, **kw: MARS(ps, lr=1e-3, mars_type="mars-lion", weight_decay=0.1, **kw),
    "mars_shampoo": lambda ps, **kw: MARS(ps, lr=1e-2, mars_type="mars-shampoo", **kw),
    "mars_exact": lambda ps, **kw: MARS(ps, lr=1e-2, is_approx=False, **kw),
    "lion": lambda ps, **kw: Lion(ps, lr=1e-3, weight_decay=0.1, **kw),
    "muon": lambda ps, **kw: Muon(ps, lr=2e-2, weight_decay=0.1, **kw),
    "moonlight": lambda ps, **kw: Moonlight(ps, lr=1e-2, wd=0.1, **kw),
    "mars_m": lambda ps, **kw: MARSM(ps, lr=1e-2, wd=0.1, **kw),
    "mars_m_lean": lambda ps, **kw: MARSM(ps, lr=1e-2, wd=0.1, lean=True, **kw),
    "mars_m_exact": lambda ps, **kw: MARSM(ps, lr=1e-2, wd=0.1, is_approx=False, **kw),
}
ALL = list(MAKERS)
APPROX = [n for n in ALL if not n.endswith("exact")]
CLASSES = [MARS, MARSM, Lion, Muon, Moonlight]
ONE_PER_CLASS = ["mars_adamw", "mars_m", "lion", "muon", "moonlight"]


def make_model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.LayerNorm(8), nn.Linear(8, 3)).to(dtype)


def batch(t, dtype=torch.float32):
    gen = torch.Generator().manual_seed(t)
    return torch.randn(5, 6, generator=gen).to(dtype), torch.randn(5, 3, generator=gen).to(dtype)


def loss_at(model, t):
    x, y = batch(t, next(model.parameters()).dtype)
    return nn.functional.mse_loss(model(x), y)


def drive(model, opt, start, steps):
    """`steps` training steps on batches start, start+1, ...; exact mode looks one batch ahead."""
    for t in range(start, start + steps):
        if getattr(opt, "needs_previous_grads", False):  # torch's optimizers lack it
            loss_at(model, 1000 + t).backward()
            opt.stash_previous_grads()
            opt.zero_grad()
        loss_at(model, t).backward()
        opt.step()
        opt.zero_grad()


def assert_same_params(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert p.dtype == q.dtype and torch.equal(p, q), name


def assert_equal_nested(a, b, path="state_dict"):
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_equal_nested(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_equal_nested(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def save_load(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def public_attrs(opt):
    return {k for k in vars(opt) if not k.startswith("_")}


# ---- copies and pickles


@pytest.mark.parametrize("fused", [True, False], ids=["compiled", "foreach"])
@pytest.mark.parametrize("name", ALL)
def test_deepcopy_and_pickle_give_optimizers_that_continue_identically(name, fused):
    model = make_model()
    opt = MAKERS[name](model.parameters(), fused=fused)
    drive(model, opt, 0, 2)
    copies = [copy.deepcopy((model, opt)), pickle.loads(pickle.dumps((model, opt)))]
    drive(model, opt, 2, 2)
    for model_c, opt_c in copies:
        assert type(opt_c) is type(opt) and public_attrs(opt_c) == public_attrs(opt)
        for attr in ("is_approx", "lean", "fused", "_stashed", "matrix_buffers", "_adamw_group_defaults"):
            assert getattr(opt_c, attr, None) == getattr(opt, attr, None), attr
        drive(model_c, opt_c, 2, 2)
        assert_same_params(model, model_c)
        assert_equal_nested(opt.state_dict(), opt_c.state_dict())


@pytest.mark.parametrize("name", ["mars_exact", "mars_m_exact"])
def test_a_copy_taken_between_stash_and_step_steps_like_the_original(name):
    model = make_model()
    opt = MAKERS[name](model.parameters())
    drive(model, opt, 0, 1)
    loss_at(model, 1001).backward()
    opt.stash_previous_grads()
    opt.zero_grad()
    copies = [copy.deepcopy((model, opt)), pickle.loads(pickle.dumps((model, opt)))]
    for m, o in [(model, opt), *copies]:
        loss_at(m, 1).backward()
        o.step()  # the copies' stash travelled with them: no stash_previous_grads() here
        o.zero_grad()
        drive(m, o, 2, 1)
    for model_c, _ in copies:
        assert_same_params(model, model_c)


def test_deepcopy_drops_hooks_as_torch_does():
    model = make_model()
    opt = MARS(model.parameters())
    calls = []
    opt.register_step_pre_hook(lambda *_: calls.append(1))
    clone = copy.deepcopy(opt)
    for p in clone.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    clone.step()
    assert calls == [] and not clone._optimizer_step_pre_hooks


# ---- state dicts


@pytest.mark.parametrize("named", [False, True], ids=["params", "named"])
@pytest.mark.parametrize("name", ALL)
def test_state_dict_round_trip_through_weights_only_load_continues_identically(name, named):
    model = make_model()
    params = model.named_parameters() if named else model.parameters()
    opt = MAKERS[name](params)
    drive(model, opt, 0, 3)
    saved = opt.state_dict()
    loaded = save_load(saved)
    assert_equal_nested(saved, loaded)
    assert loaded[RECORD_KEY]["class"] == type(opt).__name__
    assert all(torch.is_tensor(s["step"]) for s in loaded["state"].values() if "step" in s)

    resumed_model = copy.deepcopy(model)
    resumed = MAKERS[name](resumed_model.parameters())
    resumed.load_state_dict(loaded)
    drive(model, opt, 3, 3)
    drive(resumed_model, resumed, 3, 3)
    assert_same_params(model, resumed_model)
    # deterministic: equal (not identical) parameters give equal state dicts; names travel too
    assert_equal_nested(opt.state_dict(), resumed.state_dict())


@pytest.mark.parametrize("name", ALL)
def test_state_dict_without_the_record_and_with_int_steps_still_loads(name):
    """The format before this contract: no record, the step count a Python int."""
    model = make_model()
    opt = MAKERS[name](model.parameters())
    drive(model, opt, 0, 3)
    old = copy.deepcopy(opt.state_dict())
    del old[RECORD_KEY]
    for s in old["state"].values():
        if "step" in s:
            s["step"] = int(s["step"])
    resumed_model = copy.deepcopy(model)
    resumed = MAKERS[name](resumed_model.parameters())
    resumed.load_state_dict(old)
    assert all(torch.is_tensor(s["step"]) for s in resumed.state.values() if "step" in s)
    drive(model, opt, 3, 2)
    drive(resumed_model, resumed, 3, 2)
    assert_same_params(model, resumed_model)


def _stepped(maker, steps=2):
    model = make_model()
    opt = maker(model.parameters())
    drive(model, opt, 0, steps)
    return opt.state_dict(), type(opt).__name__


def _muon_flipped(ps):
    """Muon with the matrices in an AdamW group (use_muon=False) and the rest in the other."""
    ps = list(ps)
    matrices, rest = [p for p in ps if p.ndim >= 2], [p for p in ps if p.ndim < 2]
    return Muon([{"params": matrices, "use_muon": False}, {"params": rest, "use_muon": True}])


EXTRA_MAKERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3),
    "muon_flipped": _muon_flipped,
    "mars_opt1d": lambda ps: MARS(ps, optimize_1d=True),
    "mars_ge2": lambda ps: MARS(ps, two_dim_rule="ge2"),
}
# (saved by, loaded into, words the one-line error contains); with the record it also names the saver
WRONG_STATE = [
    ("muon", "mars_adamw", ["MARS"]),
    ("lion", "mars_adamw", ["MARS"]),
    ("mars_adamw", "lion", ["Lion"]),
    ("mars_m", "moonlight", ["Moonlight"]),
    ("moonlight", "mars_m", ["MARSM"]),
    ("muon", "moonlight", ["Moonlight"]),
    ("adamw", "lion", ["'foreach'", "Lion"]),
    ("adamw", "mars_adamw", ["lacks", "MARS"]),
    ("mars_lion", "mars_adamw", ["mars_type='mars-lion'", "mars_type='mars-adamw'"]),
    ("mars_opt1d", "mars_adamw", ["optimize_1d=True", "optimize_1d=False"]),
    ("mars_ge2", "mars_adamw", ["two_dim_rule='ge2'", "two_dim_rule='eq2'"]),
    ("mars_exact", "mars_adamw", ["is_approx=False", "is_approx=True"]),
    ("mars_adamw", "mars_exact", ["is_approx=True", "is_approx=False"]),
    ("mars_m_lean", "mars_m", ["lean=True", "lean=False"]),
    ("mars_m", "mars_m_lean", ["lean=False", "lean=True"]),
    ("mars_m_exact", "mars_m", ["is_approx=False", "is_approx=True"]),
    ("muon_flipped", "muon", ["use_muon=False", "use_muon=True"]),
]
# Muon and Moonlight keep the same group entries and buffer names: only the record tells them apart.
NOT_INFERABLE = {("muon", "moonlight")}


def _maker(name):
    return EXTRA_MAKERS.get(name) or MAKERS[name]


@pytest.mark.parametrize("record", [True, False], ids=["record", "no_record"])
@pytest.mark.parametrize("saver,loader,words", WRONG_STATE, ids=[f"{s}-into-{d}" for s, d, _ in WRONG_STATE])
def test_another_optimizers_state_is_refused_at_load_in_one_line(saver, loader, words, record):
    saved, saver_class = _stepped(_maker(saver))
    if record and RECORD_KEY not in saved:
        pytest.skip("torch's optimizers write no record")
    if not record:
        if (saver, loader) in NOT_INFERABLE:
            pytest.skip("only the record tells these apart")
        saved.pop(RECORD_KEY, None)
    model = make_model()
    opt = _maker(loader)(model.parameters())
    groups_before = copy.deepcopy([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups])
    with pytest.raises(ValueError) as err:
        opt.load_state_dict(saved)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{type(opt).__name__}.load_state_dict: ")
    for word in words + ([saver_class] if record else []):
        assert word in message, message
    # nothing was loaded: the optimizer still trains as built
    assert not opt.state
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == groups_before
    drive(model, opt, 0, 1)


def test_load_state_dict_hooks_run_before_the_check_and_see_the_record():
    model = make_model()
    opt = MARS(model.parameters())
    drive(model, opt, 0, 1)
    seen = []
    opt.register_state_dict_post_hook(lambda o, sd: seen.append(sd[RECORD_KEY]))
    saved = opt.state_dict()
    assert seen == [{"class": "MARS", "is_approx": True}]
    # a pre-hook that repairs a dict (here: the mars_type of a group) runs before the check
    saved["param_groups"][0]["mars_type"] = "mars-lion"
    fresh = MARS(make_model().parameters())
    with pytest.raises(ValueError, match="mars_type='mars-lion'"):
        fresh.load_state_dict(saved)

    def repair(o, sd):
        sd["param_groups"][0]["mars_type"] = "mars-adamw"
        sd["param_groups"][0]["lr"] = 0.002

    fresh.register_load_state_dict_pre_hook(repair)
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["lr"] == 0.002 and fresh.state


# ---- named parameters


@pytest.mark.parametrize("name", ALL)
def test_named_parameters_are_accepted_and_kept_in_the_state_dict(name):
    model = make_model()
    names = {id(p): n for n, p in model.named_parameters()}
    opt = MAKERS[name](model.named_parameters())
    plain_model = copy.deepcopy(model)
    plain = MAKERS[name](plain_model.parameters())
    drive(model, opt, 0, 2)
    drive(plain_model, plain, 0, 2)
    assert_same_params(model, plain_model)
    for group, saved in zip(opt.param_groups, opt.state_dict()["param_groups"], strict=True):
        assert group["param_names"] == [names[id(p)] for p in group["params"]]
        assert saved["param_names"] == group["param_names"]
    assert sorted(n for g in opt.param_groups for n in g["param_names"]) == sorted(names.values())
    # named <-> unnamed state dicts load both ways; the names are kept
    plain.load_state_dict(opt.state_dict())
    assert [g["param_names"] for g in plain.param_groups] == [g["param_names"] for g in opt.param_groups]
    other = MAKERS[name](make_model().named_parameters())
    other.load_state_dict(copy.deepcopy(plain.state_dict()))


@pytest.mark.parametrize("cls", [Muon, Moonlight, MARSM], ids=lambda c: c.__name__)
def test_named_param_groups_of_the_matrix_optimizers(cls):
    model = make_model()
    named = list(model.named_parameters())
    matrices = [(n, p) for n, p in named if p.ndim == 2]
    rest = [(n, p) for n, p in named if p.ndim < 2]
    opt = cls([{"params": matrices, "use_muon": True}, {"params": rest, "use_muon": False}])
    assert [g["param_names"] for g in opt.param_groups] == [[n for n, _ in matrices], [n for n, _ in rest]]
    # a group without use_muon is split, and each part keeps its names
    split = cls([{"params": named, "lr": 1e-3}])
    assert [g["use_muon"] for g in split.param_groups] == [True, False]
    assert [g["param_names"] for g in split.param_groups] == [[n for n, _ in matrices], [n for n, _ in rest]]
    # so does a group given as tensors plus "param_names"
    pairs = cls([{"params": [p for _, p in named], "param_names": [n for n, _ in named]}])
    assert [g["param_names"] for g in pairs.param_groups] == [[n for n, _ in matrices], [n for n, _ in rest]]
    # reference keywords with names
    keyword = cls(muon_params=matrices, adamw_params=rest)
    assert keyword.param_groups[0]["param_names"] == [n for n, _ in matrices]


# ---- dtypes


def _rel64(a, e):
    return ((a - e).abs().max() / e.abs().max()).item()


def _seq(shapes, scales, steps=4, seed=5):
    gen = torch.Generator().manual_seed(seed)
    return [
        [torch.randn(s, generator=gen, dtype=torch.float64) * k for s, k in zip(shapes, scales, strict=True)]
        for _ in range(steps)
    ]


def _run(opt_or_groups_maker, params0, grads):
    params = [nn.Parameter(p.clone()) for p in params0]
    opt = opt_or_groups_maker(params)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
    return params, opt


# one large tensor per path (compiled kernels), one small (multi-tensor)
F64_SHAPES = [(256, 160), (40000,), (6, 5), (5,)]
F64_SCALES = [1.0, 0.02, 0.05, 0.3]


@pytest.mark.parametrize("fused", [True, False], ids=["compiled", "foreach"])
@pytest.mark.parametrize("kind", ["mars-adamw", "mars-lion", "lion"])
def test_float64_elementwise_updates_keep_float64_precision(kind, fused):
    gen = torch.Generator().manual_seed(4)
    params0 = [torch.randn(s, generator=gen, dtype=torch.float64) for s in F64_SHAPES]
    grads = _seq(F64_SHAPES, F64_SCALES)
    hp = dict(lr=1e-2, weight_decay=0.1)
    if kind == "lion":
        ours, opt = _run(lambda ps: Lion(ps, betas=(0.9, 0.99), fused=fused, **hp), params0, grads)
    else:
        ours, opt = _run(
            lambda ps: MARS(ps, mars_type=kind, lr_1d=1e-2, weight_decay_1d=0.1, fused=fused, **hp),
            params0,
            grads,
        )
    expected = [p.clone() for p in params0]
    states = [{} for _ in expected]
    for t, step_grads in enumerate(grads):
        for i, (p, g) in enumerate(zip(expected, step_grads, strict=True)):
            if kind == "lion":
                ref.lion(p, g, states[i], lr=1e-2, betas=(0.9, 0.99), wd=0.1)
            elif p.ndim == 2:
                g_prev = grads[t - 1][i] if t else torch.zeros_like(g)
                ref.mars(
                    p,
                    g,
                    g_prev,
                    states[i],
                    mars_type=kind,
                    lr=1e-2,
                    betas=(0.95, 0.99),
                    eps=1e-8,
                    wd=0.1,
                    gamma=0.025,
                    clip=True,
                    matrix=True,
                )
            else:
                ref.adamw(p, g, states[i], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, wd=0.1)
    for a, e in zip(ours, expected, strict=True):
        assert a.dtype == torch.float64 and _rel64(a.detach(), e) < 1e-12, (
            tuple(a.shape),
            _rel64(a.detach(), e),
        )
    for state in opt.state.values():
        assert all(v.dtype == torch.float64 for k, v in state.items() if k != "step")


MATRICES = [(192, 176), (6, 5)]
OTHERS = [(300, 128), (5,)]


@pytest.mark.parametrize("fused", [True, False], ids=["compiled", "foreach"])
@pytest.mark.parametrize("name", ["muon", "moonlight", "mars_m", "mars_m_lean", "mars_shampoo"])
def test_float64_matrix_optimizers_keep_float64_outside_newton_schulz(name, fused):
    """Momentum buffers and the AdamW side follow float64 recurrences to 1e-12; the bfloat16
    Newton-Schulz direction is applied in float64 (the step divided by lr * scale is exactly bf16)."""
    gen = torch.Generator().manual_seed(4)
    shapes = MATRICES + OTHERS
    params0 = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    grads = _seq(shapes, [1.0, 0.05, 0.01, 0.3])
    n = len(MATRICES)
    lr, mu, gamma = 1e-2, 0.95, 0.025

    def make(ps):
        if name == "mars_shampoo":
            return MARS(ps[:n], lr=lr, mars_type="mars-shampoo", weight_decay=0.0, fused=fused)
        groups = [{"params": ps[:n], "use_muon": True}, {"params": ps[n:], "use_muon": False}]
        if name == "muon":
            return Muon(groups, lr=lr, momentum=mu, weight_decay=0.0, adamw_lr=lr, adamw_wd=0.1, fused=fused)
        if name == "moonlight":
            return Moonlight(groups, lr=lr, wd=0.0, momentum=mu, fused=fused)
        return MARSM(groups, lr=lr, wd=0.0, momentum=mu, gamma=gamma, lean=name == "mars_m_lean", fused=fused)

    ours, opt = _run(make, params0, grads[:-1])
    before = [p.detach().clone() for p in ours]
    for p, g in zip(ours, grads[-1], strict=True):
        p.grad = g.clone()
    opt.step()
    # the expected momentum buffers (float64 recurrences) and AdamW side (reference, float64)
    bufs = [torch.zeros_like(p) for p in params0[:n]]
    adamw = [p.clone() for p in params0[n:]]
    adamw_states = [{} for _ in adamw]
    for t, step_grads in enumerate(grads):
        for i in range(n):
            g = step_grads[i]
            if name == "muon":
                bufs[i] = mu * bufs[i] + g
            elif name == "moonlight":
                bufs[i] = mu * bufs[i] + (1 - mu) * g
            elif name == "mars_m_lean":
                bufs[i] = mu * bufs[i] + (1 - gamma) * (1 - mu) / mu * g
            else:
                beta = 0.95 if name == "mars_shampoo" else mu
                g_prev = grads[t - 1][i] if t else torch.zeros_like(g)
                bufs[i] = beta * bufs[i] + (1 - beta) * ref.mars_c(g, g_prev, gamma, beta, True)
        if name != "mars_shampoo":
            for j, p in enumerate(adamw):
                form = "torch" if name == "muon" else "moonlight"
                wd = 0.1 if name == "muon" else 0.0
                ref.adamw(
                    p,
                    step_grads[n + j],
                    adamw_states[j],
                    lr=lr,
                    betas=(0.9, 0.95),
                    eps=1e-8,
                    wd=wd,
                    eps_form=form,
                )
    buffer = "exp_avg" if name == "mars_shampoo" else "momentum_buffer"
    for i in range(n):
        assert _rel64(opt.state[ours[i]][buffer], bufs[i]) < 1e-12, i
        rows, cols = params0[i].shape
        scale = (
            0.2 * max(rows, cols) ** 0.5
            if name in ("moonlight", "mars_m", "mars_m_lean")
            else max(1, rows / cols) ** 0.5
        )
        # the last step is lr * scale * O with O bfloat16, applied in float64: O comes back exactly
        direction = (before[i] - ours[i].detach()) / (lr * scale)
        assert ours[i].dtype == torch.float64
        assert torch.allclose(direction, direction.bfloat16().double(), rtol=1e-6, atol=1e-12), i
    if name != "mars_shampoo":
        for a, e in zip(ours[n:], adamw, strict=True):
            assert _rel64(a.detach(), e) < 1e-12, tuple(e.shape)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_complex_and_integer_parameters_raise_one_clear_error(cls):
    z = nn.Parameter(torch.randn(3, 4, dtype=torch.complex64))
    with pytest.raises(
        ValueError,
        match=rf"^{cls.__name__} does not support a parameter of shape \(3, 4\) and dtype "
        r"torch.complex64: .*view_as_real",
    ):
        cls([z])
    opt = cls(make_model().parameters())
    before = len(opt.param_groups)
    with pytest.raises(ValueError, match="torch.complex64"):
        opt.add_param_group({"params": [nn.Parameter(torch.randn(2, 2)), z]})
    assert len(opt.param_groups) == before
    with pytest.raises(ValueError, match=r"dtype torch.int64: .*floating-point"):
        cls([torch.zeros(3, dtype=torch.int64)])


@pytest.mark.parametrize("name", ONE_PER_CLASS)
def test_mixed_dtypes_and_non_contiguous_parameters(name):
    """float32, float64 and non-contiguous tensors in one group: each keeps its dtype, and a
    non-contiguous parameter steps exactly like a contiguous copy of it."""
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(10, 5, 2)[..., 0])
    b = nn.Parameter(torch.randn(10, 2)[..., 0])
    w64 = nn.Parameter(torch.randn(4, 3, dtype=torch.float64))
    assert not w.is_contiguous() and not b.is_contiguous()
    twins = [nn.Parameter(t.detach().clone().contiguous()) for t in (w, b, w64)]
    opt, opt_c = MAKERS[name]([w, b, w64]), MAKERS[name](twins)
    for t in range(3):
        gen = torch.Generator().manual_seed(t)
        for p, q in zip((w, b, w64), twins, strict=True):
            p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            q.grad = p.grad.clone()
        opt.step()
        opt_c.step()
    for p, q in zip((w, b, w64), twins, strict=True):
        assert p.dtype == q.dtype and torch.equal(p, q)
    assert w64.dtype == torch.float64


# ---- torch.compile of a whole training step


def _train_step(model, opt):
    def train_step(x, y):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return train_step


def _square_model():
    """Two same-shaped matrices: one Newton-Schulz batch to trace, not two."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.LayerNorm(6), nn.Linear(6, 6))


def _square_batch(t):
    gen = torch.Generator().manual_seed(t)
    return torch.randn(5, 6, generator=gen), torch.randn(5, 6, generator=gen)


def _run_steps(name, steps, backend=None):
    """`steps` training steps under a torch lr schedule that changes lr at every step (and, through
    keep_lr_1d_ratio, MARS's lr_1d), eagerly or compiled with `backend`."""
    model = _square_model()
    opt = MAKERS[name](model.parameters())
    for g in opt.param_groups:
        if "ns_steps" in g:
            g["ns_steps"] = 2  # a shorter graph to trace; the same code
    if isinstance(opt, MARS):
        opt.register_step_pre_hook(keep_lr_1d_ratio)
    schedule = LambdaLR(opt, lambda t: 1.0 / (t + 1))
    step = _train_step(model, opt)
    if backend is not None:
        step = torch.compile(step, backend=backend)
    for t in range(steps):
        # compiled: the first call creates the state; the second sees lr change and the third the
        # lr_1d the hook wrote (one recompile each makes them graph inputs); after that neither the
        # step count nor the schedule may recompile
        with torch._dynamo.config.patch(error_on_recompile=backend is not None and t >= 3):
            step(*_square_batch(t))
        schedule.step()
    return model


NEWTON_SCHULZ = {"mars_shampoo", "muon", "moonlight", "mars_m", "mars_m_lean"}
# Inductor for MARS-AdamW (the elementwise kind) and Muon (the Newton-Schulz kind); aot_eager for the rest.
COMPILED = [("mars_adamw", "inductor"), ("muon", "inductor")] + [
    (n, "aot_eager") for n in APPROX if n not in ("mars_adamw", "muon")
]


@pytest.mark.parametrize("name,backend", COMPILED, ids=[f"{n}-{b}" for n, b in COMPILED])
def test_compiled_training_step_equals_the_eager_step(name, backend):
    """Equal to float32 tolerance, except Inductor's Newton-Schulz: it rounds its bfloat16 iteration
    less often than eager ops do (both are within bfloat16 error of a float64 Newton-Schulz), so
    there the check is the bfloat16 tolerance of test_matrix_optimizers, on the distance moved."""
    torch._dynamo.reset()
    steps = 5
    compiled = _run_steps(name, steps, backend)
    eager = _run_steps(name, steps)
    start = _square_model()
    ns_tolerance = backend == "inductor" and name in NEWTON_SCHULZ
    for (n, a), b, s in zip(compiled.named_parameters(), eager.parameters(), start.parameters(), strict=True):
        if ns_tolerance:
            assert ((a - b).norm() / (b - s).norm()).item() < 5e-2, n
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize("name", ["mars_adamw", "lion", "mars_m"])
def test_step_alone_compiles_without_graph_breaks(name):
    """torch.compile(fullgraph=True) of the optimizer step itself (one class of each kind)."""
    torch._dynamo.reset()
    model, eager_model = make_model(), make_model()
    opt, eager = MAKERS[name](model.parameters()), MAKERS[name](eager_model.parameters())
    compiled_step = torch.compile(opt.step, backend="aot_eager", fullgraph=True)
    for t in range(3):
        for m in (model, eager_model):
            loss_at(m, t).backward()
        compiled_step()
        eager.step()
        opt.zero_grad()
        eager.zero_grad()
    for (n, a), b in zip(model.named_parameters(), eager_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize("name", ["mars_exact", "mars_m_exact"])
def test_exact_mode_inside_torch_compile_runs_eagerly(name):
    torch._dynamo.reset()
    models = [make_model(), make_model()]
    opts = [MAKERS[name](m.parameters()) for m in models]

    def make_step(model, opt):
        def train_step(x, y, nx, ny):
            nn.functional.mse_loss(model(nx), ny).backward()
            opt.stash_previous_grads()
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()

        return train_step

    eager, compiled = (
        make_step(models[0], opts[0]),
        torch.compile(make_step(models[1], opts[1]), backend="aot_eager"),
    )
    for t in range(3):
        for fn in (eager, compiled):
            fn(*batch(t), *batch(t + 1))
    assert_same_params(*models)
    # the protocol error still reaches the caller as itself
    model, opt = models[1], opts[1]

    def no_stash(x, y):
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    with pytest.raises(RuntimeError, match="stash_previous_grads"):
        torch.compile(no_stash, backend="aot_eager")(*batch(9))


# ---- hooks, schedulers, param groups, zero and missing grads, printing, descent


@pytest.mark.parametrize("name", ALL)
def test_step_hooks_fire_in_order_and_can_be_removed(name):
    model = make_model()
    opt = MAKERS[name](model.parameters())
    calls = []
    handles = [
        register_optimizer_step_pre_hook(lambda *_: calls.append("global pre")),
        register_optimizer_step_post_hook(lambda *_: calls.append("global post")),
        opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre")),
        opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post")),
    ]
    try:
        drive(model, opt, 0, 1)
        assert calls == ["global pre", "pre", "post", "global post"]
    finally:
        for h in handles:
            h.remove()
    drive(model, opt, 1, 1)
    assert len(calls) == 4


@pytest.mark.parametrize("name", ALL)
def test_a_torch_lr_scheduler_sets_the_effective_learning_rate(name):
    """LambdaLR(f) equals an optimizer built with f * lr; f = 0 freezes the parameters (MARS's 1-D
    path too with keep_lr_1d_ratio, which makes lr_1d follow lr)."""
    half_model, frozen_model, ref_model = make_model(), make_model(), make_model()
    half = MAKERS[name](half_model.parameters())
    LambdaLR(half, lambda step: 0.5)
    reference = MAKERS[name](ref_model.parameters())
    for g in reference.param_groups:
        g["lr"] *= 0.5
        if "lr_1d" in g:
            g["lr_1d"] *= 0.5
    if isinstance(half, MARS):
        half.register_step_pre_hook(keep_lr_1d_ratio)
    drive(half_model, half, 0, 3)
    drive(ref_model, reference, 0, 3)
    for a, b in zip(half_model.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)  # lr_1d = 1e-2 * 5e-3 / 1e-2 may be 1 ulp off

    frozen = MAKERS[name](frozen_model.parameters())
    LambdaLR(frozen, lambda step: 0.0)
    if isinstance(frozen, MARS):
        frozen.register_step_pre_hook(keep_lr_1d_ratio)
    start = copy.deepcopy(frozen_model)
    drive(frozen_model, frozen, 0, 2)
    assert_same_params(frozen_model, start)


def test_keep_lr_1d_ratio_follows_cosine_annealing_and_agrees_with_set_lr_factor():
    model = make_model()
    opt = MARS(model.parameters(), lr=6e-3, lr_1d=3e-3)
    opt.register_step_pre_hook(keep_lr_1d_ratio)
    sched = CosineAnnealingLR(opt, T_max=10)
    for t in range(4):
        drive(model, opt, t, 1)
        sched.step()
    group = opt.param_groups[0]
    drive(model, opt, 4, 1)  # the hook applies the scheduler's latest lr
    assert group["lr_1d"] == pytest.approx(3e-3 * group["lr"] / 6e-3)
    # without the hook a torch scheduler leaves lr_1d alone (documented)
    plain = MARS(make_model().parameters(), lr=6e-3, lr_1d=3e-3)
    LambdaLR(plain, lambda step: 0.1)
    assert plain.param_groups[0]["lr"] == pytest.approx(6e-4) and plain.param_groups[0]["lr_1d"] == 3e-3
    # set_lr_factor records the same initial values: the two agree
    other = MARS(make_model().parameters(), lr=6e-3, lr_1d=3e-3)
    set_lr_factor(other, 0.3)
    keep_lr_1d_ratio(other)
    assert other.param_groups[0]["lr_1d"] == pytest.approx(0.3 * 3e-3)


@pytest.mark.parametrize("name", ALL)
def test_add_param_group_steps_the_new_group_and_rolls_back_a_bad_one(name):
    model = make_model()
    first, last = model[0], model[3]
    opt = MAKERS[name](first.parameters())
    n_groups = len(opt.param_groups)
    opt.add_param_group({"params": last.parameters(), "lr": 1e-3})
    added = opt.param_groups[n_groups:]
    assert added and all(g["lr"] == 1e-3 for g in added)
    assert all(k in g for g in added for k in opt.param_groups[0] if k not in ("params", "param_names"))
    before = [p.detach().clone() for p in last.parameters()]
    drive(model, opt, 0, 2)
    assert all(not torch.equal(p, b) for p, b in zip(last.parameters(), before, strict=True))
    assert all(opt.state[p] for p in last.parameters())
    count = len(opt.param_groups)
    with pytest.raises(ValueError, match="lr=-1.0"):
        opt.add_param_group({"params": model[2].parameters(), "lr": -1.0})
    assert len(opt.param_groups) == count  # nothing half-added
    opt.add_param_group({"params": model[2].parameters()})  # the same tensors, valid this time


@pytest.mark.parametrize("name", ALL)
def test_zero_grad_and_steps_without_gradients(name):
    model = make_model()
    opt = MAKERS[name](model.parameters())
    start = copy.deepcopy(model)
    if opt.needs_previous_grads:
        opt.stash_previous_grads()  # no gradients yet: zeros
    opt.step()  # every grad is None: nothing happens, no state (but exact mode's stash)
    assert all(set(s) <= {"previous_grad"} for s in opt.state.values())
    assert_same_params(model, start)
    # zero gradients on a fresh optimizer without weight decay: a no-op step (torch's contract)
    for g in opt.param_groups:
        g["weight_decay"] = 0.0
        if "weight_decay_1d" in g:
            g["weight_decay_1d"] = 0.0
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    if opt.needs_previous_grads:
        opt.stash_previous_grads()
    opt.step()
    assert_same_params(model, start)
    loss_at(model, 0).backward()
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("name", ALL)
def test_optimizer_is_printable_with_its_options(name):
    opt = MAKERS[name](make_model().parameters())
    text = repr(opt)
    assert text.startswith(f"{type(opt).__name__} (\nOptions\n") and "\nParameter Group 0\n" in text
    for option in ("fused", *type(opt).instance_options):
        assert f"    {option}: {getattr(opt, option)}\n" in text


def rosenbrock(xy):
    x, y = xy
    return (1 - x) ** 2 + 100 * (y - x**2) ** 2


@pytest.mark.parametrize("name", ALL)
def test_goes_downhill_with_a_closure(name):
    """A least-squares problem for every optimizer (a matrix and a bias), through step(closure); the
    elementwise ones also on Rosenbrock's function (MARS on its MARS path: optimize_1d=True)."""
    gen = torch.Generator().manual_seed(0)
    w = nn.Parameter(torch.randn(4, 6, generator=gen) * 0.1)
    b = nn.Parameter(torch.zeros(4))
    x = torch.randn(64, 6, generator=gen)
    y = x @ torch.randn(6, 4, generator=gen)
    opt = MAKERS[name]([w, b])
    for g in opt.param_groups:
        g.update({k: 0.0 for k in ("weight_decay", "weight_decay_1d") if k in g})
        g.update({k: 0.1 for k in ("lr", "lr_1d") if k in g})

    def closure():
        opt.zero_grad()
        loss = ((x @ w.T + b - y) ** 2).mean()
        loss.backward()
        return loss

    losses = []
    for _ in range(30):
        if opt.needs_previous_grads:
            closure()
            opt.stash_previous_grads()
        losses.append(opt.step(closure).item())
    assert losses[-1] < 0.5 * losses[0], losses

    if name in ("mars_adamw", "mars_lion", "lion"):
        xy = nn.Parameter(torch.tensor([1.5, 1.5]))
        opt = MAKERS[name]([xy], **({"optimize_1d": True} if name.startswith("mars") else {}))
        for g in opt.param_groups:
            g["lr"] = 1e-3
        start = rosenbrock(xy).item()
        for _ in range(100):
            opt.zero_grad()
            rosenbrock(xy).backward()
            opt.step()
        assert rosenbrock(xy).item() < 0.5 * start
