"""MARS: MARS-AdamW, MARS-Lion and MARS-Shampoo, approximate and exact (docs/algorithms.md 1, 2, 5)."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.optim import Optimizer

from . import _checks, _foreach, _kernels
from ._common import (
    advance_steps,
    apply_orthogonal_update_,
    as_matrix,
    bucket_step,
    ensure_buffers,
    matrix_shape,
    step_counter,
    traced,
)
from ._contract import TorchContract
from ._exact import PreviousGradsMixin
from .newton_schulz import orthogonalize_

MARS_TYPES = ("mars-adamw", "mars-lion", "mars-shampoo")
TWO_DIM_RULES = ("eq2", "ge2")
NS_STEPS = 5  # the reference's MARS-Shampoo runs five quintic Newton-Schulz iterations

# Group entries a schedule may change: numbers in eager mode, 0-dim tensors inside torch.compile.
SCHEDULED = ("lr", "weight_decay", "gamma", "lr_1d", "weight_decay_1d")

# How a tensor is updated; see MARS._role.
ADAMW_1D, MARS_ADAMW, MARS_LION, MARS_NS = "adamw_1d", "mars_adamw", "mars_lion", "mars_ns"


class MARS(PreviousGradsMixin, TorchContract, Optimizer):
    r"""MARS (Yuan et al., 2024): scaled stochastic recursive momentum + a preconditioned step.

    For each tensor taking the MARS path, with k = gamma * beta1 / (1 - beta1)::

        c   = g + k (g - g_prev)              g_prev: approx = last step's g; exact = grad f(x_{t-1}, xi_t)
        c~  = c / ||c||_2 if ||c||_2 > 1      per tensor, from the first step on (clip_c=False: c~ = c)
        m   = beta1 m + (1 - beta1) c~
        x  <- x - lr (weight_decay x + step)

    with step = m / ((sqrt(v) / sqrt(1 - beta2^t) + eps) (1 - beta1^t)), v = beta2 v + (1 - beta2) c~^2
    (mars_type "mars-adamw"); sign(m) ("mars-lion"); NS(m / (1 - beta1)) sqrt(max(1, rows/cols)) with
    quintic Newton-Schulz in bfloat16 ("mars-shampoo", matrices; other MARS tensors take the AdamW form).

    Which tensors take the MARS path: matrices (two_dim_rule "eq2": ndim == 2, the reference; "ge2":
    ndim >= 2, orthogonalised as (shape[0], -1)), plus every other tensor when optimize_1d=True. With
    optimize_1d=False (the reference default) the rest (LayerNorm weights, biases, and 3-D/4-D tensors
    under "eq2") get plain AdamW on the raw gradient with betas_1d, weight_decay_1d (whatever the
    group's weight_decay, as in the reference) and learning rate lr_1d. gamma is read from the param
    group at every step, so it can be scheduled. gamma=0 with clip_c=False is AdamW (betas) / Lion with
    beta1 == beta2.

    Scheduling: lr_1d is a separate group entry that the reference keeps at a fixed ratio to lr.
    `mars.optim.set_lr_factor(opt, f)` scales both. A torch.optim.lr_scheduler (or code writing
    group["lr"]) changes only "lr": the 1-D AdamW path would keep its initial lr_1d. With a torch
    scheduler, register `mars.optim.keep_lr_1d_ratio` as a step pre-hook
    (`opt.register_step_pre_hook(keep_lr_1d_ratio)`), which sets lr_1d = initial lr_1d * lr / initial_lr
    before every step; hooks do not survive copy.deepcopy, pickle or a new optimizer: register it again.

    Approximate mode (is_approx=True, default): g_prev is a copy of the gradient this optimizer saw
    at its previous step (after the loop's gradient clipping), kept in its own buffer::

        model = torch.nn.Linear(8, 1)
        batches = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(10)]
        loss_fn = lambda batch: torch.nn.functional.mse_loss(model(batch[0]), batch[1])
        opt = MARS(model.parameters(), lr=6e-3, weight_decay=0.01)
        for batch in batches:
            loss_fn(batch).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    Exact mode (is_approx=False; `needs_previous_grads` is True): two gradients per step, looking one
    batch ahead (docs/algorithms.md section 5)::

        opt = MARS(model.parameters(), lr=6e-3, weight_decay=0.01, is_approx=False)
        for batch, next_batch in zip(batches, batches[1:]):
            loss_fn(next_batch).backward()      # grad f(x_t, xi_{t+1})
            opt.stash_previous_grads()          # becomes g_prev of step t+1
            opt.zero_grad(set_to_none=True)
            loss_fn(batch).backward()           # grad f(x_t, xi_t)
            opt.step()                          # g_prev = the stash of step t-1 (zeros at step 1)
            opt.zero_grad(set_to_none=True)

    The reference's method names update_previous_grad() (= stash_previous_grads) and
    update_last_grad() (nothing left to do: step() swaps the buffers) also work.

    State per tensor: "exp_avg", "exp_avg_sq" (AdamW forms), "last_grad" (MARS path), "step" (a
    float32 CPU scalar, as in torch's optimizers); "max_exp_avg_sq" with amsgrad; exact mode adds
    "previous_grad". Approximate MARS-AdamW therefore keeps 3 buffers per matrix parameter (12 bytes
    in float32), 2 per 1-D parameter. state_dict() also records the class and is_approx; loading a
    state dict saved by another optimizer, or with another is_approx, mars_type, optimize_1d or
    two_dim_rule, raises a ValueError saying so.

    Non-finite gradients are not detected (that would need a device-to-host sync per step): a NaN or
    inf in g makes ||c|| non-finite, which propagates into m, v and the parameters of that tensor
    (and, through g_prev, into the next step). Check the global gradient norm before step() and skip
    the step when it is not finite, as this project's trainer does.

    Implementation: per-tensor fused kernels compiled with torch.compile where available, else
    multi-tensor torch._foreach_* ops (fused=None picks; True requires the compiled kernels; False
    forces multi-tensor, also used for amsgrad, and inside an outer torch.compile of a training step,
    which fuses them itself). Neither reads any value back from the device. Arithmetic runs in
    float64 for float64 tensors and in float32 otherwise (bf16/fp16 storage); MARS-Shampoo's
    Newton-Schulz runs in bfloat16 by design and its update is applied in the parameter's dtype.
    Parameters must be real floating point (complex ones raise a ValueError at construction); tensors
    with no entries are skipped. Accepts named parameters (model.named_parameters()) like torch's
    optimizers; state_dict() then carries "param_names".
    """

    instance_options = ("is_approx",)
    role_keys = ("mars_type", "optimize_1d", "two_dim_rule")

    def __init__(
        self,
        params,
        lr=3e-3,
        betas=(0.95, 0.99),
        eps=1e-8,
        weight_decay=0.0,
        amsgrad=False,
        gamma=0.025,
        is_approx=True,
        mars_type="mars-adamw",
        optimize_1d=False,
        lr_1d=3e-3,
        betas_1d=(0.9, 0.95),
        weight_decay_1d=0.1,
        *,
        clip_c=True,
        two_dim_rule="eq2",
        fused=None,
    ):
        _checks.flag("MARS", "is_approx", is_approx)
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            gamma=gamma,
            mars_type=mars_type,
            optimize_1d=optimize_1d,
            lr_1d=lr_1d,
            betas_1d=tuple(betas_1d),
            weight_decay_1d=weight_decay_1d,
            clip_c=clip_c,
            two_dim_rule=two_dim_rule,
        )
        _validate(defaults)
        self.is_approx = is_approx
        self.fused = fused
        self._stashed = False
        super().__init__(params, defaults)
        _kernels.check_fused_flag("MARS", fused, _kernels.first_device(self.param_groups))

    def _validate_group(self, group: dict) -> None:
        _validate(group)

    @staticmethod
    def _role(p, group) -> str:
        matrix = p.ndim == 2 if group["two_dim_rule"] == "eq2" else p.ndim >= 2
        if not (matrix or group["optimize_1d"]):
            return ADAMW_1D
        if group["mars_type"] == "mars-shampoo":
            return MARS_NS if matrix else MARS_ADAMW
        return MARS_LION if group["mars_type"] == "mars-lion" else MARS_ADAMW

    def _takes_previous_grad(self, p, group) -> bool:
        return self._role(p, group) != ADAMW_1D

    def _buffers(self, role: str, amsgrad: bool) -> tuple[str, ...]:
        names = ("exp_avg",)
        if role in (ADAMW_1D, MARS_ADAMW):
            names += ("exp_avg_sq", "max_exp_avg_sq") if amsgrad else ("exp_avg_sq",)
        if role != ADAMW_1D:
            names += ("last_grad",)
        return names

    def _buffer_names(self, p, group) -> set[str]:
        role = self._role(p, group)
        names = {"step", *self._buffers(role, amsgrad=True)}
        if role != ADAMW_1D and not self.is_approx:
            names.add("previous_grad")
        return names

    def _infer_options(self, entries) -> dict:
        mars_path = [buffers for p, group, buffers in entries if self._role(p, group) != ADAMW_1D]
        if any("previous_grad" in b for b in mars_path):
            return {"is_approx": (False, "'previous_grad' buffers (exact mode)")}
        if any("last_grad" in b for b in mars_path):
            return {"is_approx": (True, "'last_grad' buffers without 'previous_grad' (approximate mode)")}
        return {}

    @torch.no_grad()
    def _step(self, closure=None):
        """One MARS step on every tensor with a gradient (`step()` calls it)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_stashed()
        took_prev = []
        for group in self.param_groups:
            for (role, _, _, count), params in self._buckets(group).items():
                step = advance_steps([self.state[p] for p in params], count)
                self._update(group, role, params, step)
                if role != ADAMW_1D:
                    took_prev.extend(params)
        if not self.is_approx:
            self._rotate_previous_grads(took_prev)
        return loss

    def _buckets(self, group: dict) -> dict[tuple, list]:
        """The group's tensors with a gradient, by (role, device, dtype, step count): each bucket is
        one kernel call (`_update`). Creates the missing state buffers."""
        buckets = defaultdict(list)
        for p in group["params"]:
            if p.grad is None or p.numel() == 0:
                continue
            _checks.dense_grad("MARS", p)
            role = self._role(p, group)
            state = self.state[p]
            count = step_counter(state)
            ensure_buffers(state, p, self._buffers(role, group["amsgrad"]))
            buckets[(role, p.device, p.dtype, bucket_step(count))].append(p)
        return buckets

    def _update(self, group: dict, role: str, params: list, step) -> None:
        """Dispatch one bucket to its kernel. step: the bucket's step count, or (inside torch.compile)
        the list of its step counters."""
        hp = {key: traced(group[key], params[0]) for key in SCHEDULED}
        grads = [p.grad for p in params]
        states = [self.state[p] for p in params]
        exp_avgs = [s["exp_avg"] for s in states]
        amsgrad = group["amsgrad"] and role in (ADAMW_1D, MARS_ADAMW)
        exp_avg_sqs = [s["exp_avg_sq"] for s in states] if role in (ADAMW_1D, MARS_ADAMW) else None
        maxes = [s["max_exp_avg_sq"] for s in states] if amsgrad else None
        impl = _foreach if amsgrad else _kernels.select(self.fused, params, grads, exp_avgs)
        beta1, beta2 = group["betas"]
        if role == ADAMW_1D:
            beta1_1d, beta2_1d = group["betas_1d"]
            impl.adamw_(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                lr=hp["lr_1d"],
                weight_decay=hp["weight_decay_1d"],
                beta1=beta1_1d,
                beta2=beta2_1d,
                step=step,
                eps=group["eps"],
                max_exp_avg_sqs=maxes,
            )
        elif role == MARS_NS:
            self._shampoo(group, hp, params, grads, states)
        else:
            impl.mars_(
                params,
                grads,
                [s["last_grad"] for s in states],
                exp_avgs,
                exp_avg_sqs,
                kind="adamw" if role == MARS_ADAMW else "lion",
                lr=hp["lr"],
                weight_decay=hp["weight_decay"],
                beta1=beta1,
                beta2=beta2,
                step=step,
                eps=group["eps"],
                gamma=hp["gamma"],
                clip=group["clip_c"],
                max_exp_avg_sqs=maxes,
            )

    def _shampoo(self, group: dict, hp: dict, params: list, grads: list, states: list) -> None:
        """MARS-Shampoo on matrices: same-shaped ones share one batched Newton-Schulz."""
        beta1 = group["betas"][0]
        by_shape = defaultdict(list)
        for i, p in enumerate(params):
            by_shape[matrix_shape(p)].append(i)
        for (rows, cols), idx in by_shape.items():
            ps = [params[i] for i in idx]
            gs = [as_matrix(grads[i]) for i in idx]
            prevs = [as_matrix(states[i]["last_grad"]) for i in idx]
            bufs = [as_matrix(states[i]["exp_avg"]) for i in idx]
            X = torch.empty((len(idx), rows, cols), dtype=torch.bfloat16, device=ps[0].device)
            impl = _kernels.select(self.fused, gs, prevs, bufs)
            impl.mars_momentum_(
                gs,
                prevs,
                bufs,
                list(X.unbind(0)),
                beta=beta1,
                gamma=hp["gamma"],
                clip=group["clip_c"],
                out_scale=1.0 / (1.0 - beta1),
            )
            O = orthogonalize_(X, steps=NS_STEPS, eps=group["eps"], form="reference")
            apply_orthogonal_update_(
                ps, O, lr=hp["lr"], weight_decay=hp["weight_decay"], scale=max(1.0, rows / cols) ** 0.5
            )


def _validate(group: dict) -> None:
    owner = "MARS"
    for name in ("lr", "eps", "weight_decay", "gamma", "lr_1d", "weight_decay_1d"):
        _checks.non_negative(owner, name, group[name])
    _checks.betas(owner, "betas", group["betas"])
    _checks.betas(owner, "betas_1d", group["betas_1d"])
    _checks.choice(owner, "mars_type", group["mars_type"], MARS_TYPES)
    _checks.choice(owner, "two_dim_rule", group["two_dim_rule"], TWO_DIM_RULES)
    for name in ("amsgrad", "optimize_1d", "clip_c"):
        _checks.flag(owner, name, group[name])
