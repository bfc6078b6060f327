"""The step every optimizer of this package takes (`BucketedStep`), and what it is made of: state buffers,
step counters, the hyperparameters the kernels take.

A step buckets the tensors that have a gradient by role (`_role`: which update a tensor takes), device,
dtype and, for a role that keeps a step count, the count (the kernels take one per bucket), or else,
for an orthogonalised role, the matrix shape (one batched Newton-Schulz); then

1. for the roles that take MARS's c_t, the clip factors and diagnostics (`_clip_scales`: one pass
   over g and g_prev, one all-reduce when sharded; mars.optim._correction);
2. each elementwise bucket's update rule (`_update`; AdamW, of g or of c_t, is `_adam`);
3. each orthogonalised bucket's momentum, written as bfloat16 Newton-Schulz inputs (`_momentum`),
   one Newton-Schulz per setting over all of the step's matrices (divided over the ranks when
   sharded or replicated, mars.optim._dist), then x <- x (1 - lr wd) - lr scale O
   (rules.apply_orthogonal_).
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict

import torch
from torch import Tensor

from . import _kernels, rules
from ._dist import local
from .newton_schulz import orthogonalize_


def zeros_like(p: Tensor) -> Tensor:
    """A state buffer: same dtype and device as p, always contiguous (the fused kernels flatten it)."""
    return torch.zeros_like(p, memory_format=torch.contiguous_format)


def ensure_buffers(state: dict, p: Tensor, names) -> None:
    """Create the missing zero buffers `names` ("step": the step counter; a tensor can change role, e.g.
    when a group's optimize_1d flips, so buffers are created when first needed, not all at once)."""
    for name in names:
        if name == "step":
            step_counter(state)
        elif name not in state:
            state[name] = zeros_like(p)


def step_counter(state: dict) -> Tensor:
    """The tensor's step count, state["step"]: a float32 CPU scalar, as in torch's own optimizers.

    A Python int would be a constant to torch.compile, so a compiled training step would recompile
    at every step; a CPU scalar is read without any device synchronisation. Created at 0 on first
    use; anything else found there (a Python int from state dicts written before the counter became
    a tensor, a counter moved to the GPU with the rest of the state) is converted once."""
    count = state.get("step")
    if not (isinstance(count, Tensor) and count.device.type == "cpu" and count.dtype == torch.float32):
        count = state["step"] = as_step_counter(0 if count is None else count)
    return count


def as_step_counter(value) -> Tensor:
    if isinstance(value, Tensor):
        return value.detach().to(device="cpu", dtype=torch.float32).reshape(())
    return torch.tensor(float(value), dtype=torch.float32)


def bucket_step(count: Tensor) -> int | None:
    """The step-count part of an update bucket's key: the count this step reaches (eager), or None
    inside torch.compile, where the bucket passes its counters to the kernels instead (see
    `advance_steps`)."""
    if torch.compiler.is_compiling():
        return None
    return int(count) + 1  # a CPU scalar: no device sync


def advance_steps(states: list[dict], step: int | None) -> int | list[Tensor]:
    """Add 1 to the step counters of a bucket; returns what the kernels take as `step`: the bucket's
    common count (eager), or the list of counters (inside torch.compile)."""
    counters = [s["step"] for s in states]
    torch._foreach_add_(counters, 1.0)
    return counters if step is None else step


def adam_hyper(
    *, lr, weight_decay, betas, eps: float, step, params: list[Tensor], eps_form: str = "torch"
) -> dict:
    """The hyperparameters of rules.adamw for a bucket that reaches step `step` (its common count, or
    inside torch.compile the list of its step counters): the bias corrections are numbers, or per
    tensor 0-dim tensors computed in float64 and handed over in the compute dtype.
    eps_form "torch": m / (sqrt(v / bc2) + eps) / bc1 (torch, MARS); "moonlight": m / (sqrt(v) + eps)
    * sqrt(bc2) / bc1, eps not bias-corrected (Moonlight, MARS-M), i.e. eps / sqrt(bc2) in the former."""
    beta1, beta2 = betas
    if isinstance(step, list):
        bc1, bc2_sqrt = [], []
        for count, p in zip(step, params, strict=True):
            t = count.to(torch.float64)
            dtype = torch.float64 if p.dtype == torch.float64 else torch.float32
            bc1.append((1.0 - beta1**t).to(device=p.device, dtype=dtype))
            bc2_sqrt.append((1.0 - beta2**t).sqrt().to(device=p.device, dtype=dtype))
        if eps_form != "torch":
            eps = [eps / b for b in bc2_sqrt]
    else:
        bc1, bc2_sqrt = 1.0 - beta1**step, math.sqrt(1.0 - beta2**step)
        if eps_form != "torch":
            eps = eps / bc2_sqrt
    return dict(
        lr=lr, weight_decay=weight_decay, beta1=beta1, beta2=beta2, bc1=bc1, bc2_sqrt=bc2_sqrt, eps=eps
    )


def group_value(group: dict, key: str, like: Tensor):
    """A param-group hyperparameter that a schedule may change (lr, weight_decay, gamma) as the kernels
    take it: the number itself, or inside torch.compile a 0-dim tensor made from it on `like`'s device.
    The compiler then takes the value as a graph input (after one recompile when it first changes)
    instead of a constant to guard on, so an lr schedule does not recompile the step at every step."""
    value = group[key]
    if not torch.compiler.is_compiling():
        return value
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    return torch.zeros((), dtype=dtype, device=like.device) + value


def matrix_shape(t: Tensor) -> tuple[int, int]:
    """The 2-D shape a >= 2-D tensor is orthogonalised as: (shape[0], product of the rest)."""
    return t.shape[0], t.numel() // t.shape[0]


def as_matrix(t: Tensor) -> Tensor:
    return t if t.ndim == 2 else t.reshape(t.shape[0], -1)


def _subset(values, idx: list[int]):
    return [values[i] for i in idx] if isinstance(values, list) else values


class BucketedStep:
    """Mixin before TorchContract in the bases of every optimizer here: the step (see the module
    docstring). A subclass sets `owner` and `fused`, and defines

    _role(p, group) -> str          which update p takes
    _buffers(role, group, every=False)  the state entries of a role ("step": the counter), in
                                    creation order; every=True: all it may ever keep (state dicts)
    _update(group, role, params, step, scales)  an elementwise bucket's update
    orthogonalised                  roles whose update is orthogonalised; for them
        _momentum(group, params, grads, outs, scales)  write the Newton-Schulz inputs to outs
        _ns_setting(group) -> (steps, eps) and `form` (rules.orthogonal_scale)
    g_prev_roles                    roles that take c_t (clip scales, exact mode: _correction)
    """

    owner: str
    fused: bool | None
    orthogonalised: tuple[str, ...] = ()
    g_prev_roles: tuple[str, ...] = ()
    form = "reference"
    # torch's found_inf convention (its fused optimizers, torch.amp.GradScaler): a float tensor set as
    # optimizer.found_inf before step(); when it is nonzero the step changes no parameter and no state
    # buffer (decided on the device: nothing is read back). The step counters, CPU scalars, still count it.
    takes_found_inf = True
    _gate: Tensor | None = None

    def step(self, closure=None):
        """One step on every tensor with a gradient (tensors whose grad is None are skipped); returns
        the closure's loss when a closure is given. With `self.found_inf` set (a 0-dim float tensor,
        nonzero: skip) the parameters and buffers keep their values where it says so."""
        return self._step(closure)

    def _found_inf_gate(self) -> Tensor | None:
        """The step's gate from `found_inf`: a 0-dim bool tensor, true where the step is taken."""
        found_inf = getattr(self, "found_inf", None)
        return None if found_inf is None else found_inf.reshape(()) == 0

    @torch.no_grad()
    def _step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._gate = self._found_inf_gate()
        self._before_step()
        plan = []  # (group, role, params, step) per bucket
        for group in self.param_groups:
            for (role, _, _, part), params in self._buckets(group).items():
                states = [self.state[p] for p in params]
                step = advance_steps(states, part) if "step" in self._buffers(role, group) else None
                plan.append((group, role, params, step))
        g_prev = [b for b in plan if b[1] in self.g_prev_roles]  # the buckets that take c_t
        scales = self._clip_scales(g_prev)
        matrices = []
        for group, role, params, step in plan:
            if role in self.orthogonalised:
                matrices += self._ns_inputs(group, params, scales.get(id(params), 1.0))
            else:
                self._update(group, role, params, step, scales.get(id(params), 1.0))
        if matrices:
            self._orthogonal_updates(matrices)
        self._after_step(g_prev)
        self._gate = None
        return loss

    def _before_step(self) -> None:
        pass

    def _after_step(self, g_prev: list) -> None:
        pass

    def _clip_scales(self, buckets: list) -> dict:
        """{id(bucket params): the clip scales of its c_t}; none without c_t (mars.optim._correction)."""
        return {}

    def _buckets(self, group: dict) -> dict[tuple, list]:
        """The group's tensors with a gradient by (role, device, dtype, step count or matrix shape or
        None): one kernel call, or one batched Newton-Schulz, each. Creates the missing state."""
        buckets = defaultdict(list)
        for p in group["params"]:
            if p.grad is None or p.numel() == 0:
                continue
            if p.grad.is_sparse:  # no per-tensor norm or moment buffers here
                raise RuntimeError(
                    f"{self.owner} does not support sparse gradients (parameter of shape "
                    f"{tuple(p.shape)}); use dense gradients, e.g. nn.Embedding(..., sparse=False)"
                )
            role = self._role(p, group)
            state = self.state[p]
            names = self._buffers(role, group)
            ensure_buffers(state, p, names)
            if "step" in names:
                part = bucket_step(state["step"])
            else:
                part = matrix_shape(p) if role in self.orthogonalised else None
            buckets[(role, p.device, p.dtype, part)].append(p)
        return buckets

    def _buffer_names(self, p, group) -> set[str]:
        return set(self._buffers(self._role(p, group), group, every=True))

    def _adam(
        self, params, step, *, lr, weight_decay, betas, eps, amsgrad=False, eps_form="torch", mars=None
    ):
        """AdamW over a bucket (rules.adamw); with `mars` ({"gamma", "scale"}) MARS-AdamW, AdamW on the
        clipped c_t, which keeps g as the next g_prev (rules.mars_adamw)."""
        states = [self.state[p] for p in params]
        ps, grads = [local(p) for p in params], [local(p.grad) for p in params]
        m = [local(s["exp_avg"]) for s in states]
        v = [local(s["exp_avg_sq"]) for s in states]
        vmax = [local(s["max_exp_avg_sq"]) for s in states] if amsgrad else None
        moments = [m, v] if vmax is None else [m, v, vmax]
        adam = adam_hyper(
            lr=lr, weight_decay=weight_decay, betas=betas, eps=eps, step=step, params=ps, eps_form=eps_form
        )
        if mars is None:
            outs = [ps, *moments]
            _kernels.update(
                rules.adamw, [ps, grads, m, v, vmax], outs, fused=self.fused, gate=self._gate, **adam
            )
            return
        prevs = [local(s["last_grad"]) for s in states]
        _kernels.update(
            rules.mars_adamw,
            [ps, grads, prevs, m, v, vmax],
            [ps, *moments, prevs],
            fused=self.fused,
            gate=self._gate,
            options={"correction": self.correction},
            **mars,
            **adam,
        )

    def _ns_inputs(self, group: dict, params: list, scales) -> list[tuple]:
        """A bucket's momentum, written as bfloat16 Newton-Schulz inputs: per matrix shape,
        (group, params, shape, X) with X (n, rows here, cols), this rank's pieces when sharded."""
        by_shape = defaultdict(list)
        for i, p in enumerate(params):
            by_shape[matrix_shape(p)].append(i)
        inputs = []
        for shape, idx in by_shape.items():
            ps = [params[i] for i in idx]
            grads = [as_matrix(local(p.grad)) for p in ps]
            X = torch.empty((len(ps), *grads[0].shape), dtype=torch.bfloat16, device=grads[0].device)
            self._momentum(group, ps, grads, list(X.unbind(0)), _subset(scales, idx))
            inputs.append((group, ps, shape, X))
        return inputs

    def _buffers_of(self, params: list, name: str) -> list[Tensor]:
        return [as_matrix(local(self.state[p][name])) for p in params]

    def _orthogonal_updates(self, matrices: list[tuple]) -> None:
        """One Newton-Schulz per setting over the step's matrices (n, rows, cols), divided over the
        ranks when sharded or replicated; then x <- x (1 - lr wd) - lr scale O on each."""
        by_setting = defaultdict(list)
        for i, (group, *_) in enumerate(matrices):
            by_setting[self._ns_setting(group)].append(i)
        for (steps, eps), idx in by_setting.items():
            ns = functools.partial(orthogonalize_, steps=steps, eps=eps, form=self.form)
            results = self._orthogonalize([matrices[i][3] for i in idx], [matrices[i][2] for i in idx], ns)
            for i, O in zip(idx, results, strict=True):
                group, params, (rows, cols), _ = matrices[i]
                rules.apply_orthogonal_(
                    [local(p) for p in params],
                    O,
                    lr=group_value(group, "lr", params[0]),
                    weight_decay=group_value(group, "weight_decay", params[0]),
                    scale=rules.orthogonal_scale(self.form, rows, cols),
                    gate=self._gate,
                )
