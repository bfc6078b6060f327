"""Muon and Moonlight (MARS_SPEC sections 3 and 4), and the machinery they share with MARS-M."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import Tensor
from torch.optim import Optimizer

from . import _checks, _kernels
from ._common import apply_orthogonal_update_, as_matrix, ensure_buffers, matrix_shape
from .newton_schulz import orthogonalize_


class MatrixOptimizer(Optimizer):
    """Base of Muon, Moonlight and MARS-M: matrices get an orthogonalised momentum step, the rest AdamW.

    Param groups carry "use_muon": True for hidden weight matrices (tensors of fewer than 2 dims in
    such a group still take AdamW), False for the AdamW tensors (the reference sends embeddings, the
    output head and 1-D tensors there). A group without the flag is split by ndim (>= 2: matrices);
    embeddings and heads cannot be recognised that way, so build groups with
    `mars.optim.param_groups(model, name)` or pass muon_params= / adamw_params= (the reference form).
    Same-shaped matrices of a group share one batched Newton-Schulz. Tensors whose grad is None are
    skipped; non-finite gradients are not detected and propagate into the state and the parameters.
    """

    owner = "MatrixOptimizer"
    needs_previous_grads = False  # exact MARS-M overrides this
    ns_form = "reference"
    ns_eps = 1e-7
    adamw_eps_form = "torch"
    matrix_buffers: tuple[str, ...] = ("momentum_buffer",)

    def __init__(self, params, muon_params, adamw_params, defaults: dict, fused, adamw_group_defaults=None):
        self.fused = fused
        self._adamw_group_defaults = adamw_group_defaults or {}
        super().__init__(self._collect(params, muon_params, adamw_params), defaults)
        _kernels.check_fused_flag(self.owner, fused, _kernels.first_device(self.param_groups))

    def _collect(self, params, muon_params, adamw_params):
        if params is not None:
            if muon_params is not None or adamw_params is not None:
                raise ValueError(
                    f"{self.owner}: pass either params (tensors or param groups) or "
                    "muon_params=/adamw_params=, not both"
                )
            return params
        if muon_params is None:
            raise ValueError(f"{self.owner}: no parameters: pass params, or muon_params= (and adamw_params=)")
        groups = [{"params": list(muon_params), "use_muon": True}]
        adamw_params = list(adamw_params) if adamw_params is not None else []
        if adamw_params:
            groups.append({"params": adamw_params, "use_muon": False})
        return groups

    def add_param_group(self, param_group: dict) -> None:
        group = dict(param_group)
        if "wd" in group:  # the reference's key
            if "weight_decay" in group:
                raise ValueError(f"{self.owner}: a param group has both 'wd' and 'weight_decay'; keep one")
            group["weight_decay"] = group.pop("wd")
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        use_muon = group.get("use_muon")
        if use_muon is None:
            parts = [(True, [p for p in params if p.ndim >= 2]), (False, [p for p in params if p.ndim < 2])]
            parts = [(use, ps) for use, ps in parts if ps] or [(True, params)]
        else:
            _checks.flag(self.owner, "use_muon", use_muon)
            parts = [(use_muon, params)]
        for use, ps in parts:
            sub = dict(group, params=ps, use_muon=use)
            if not use:
                for key, value in self._adamw_group_defaults.items():
                    sub.setdefault(key, value)
            super().add_param_group(sub)
            self._validate(self.param_groups[-1])

    def _validate(self, group: dict) -> None:
        owner = self.owner
        for name in ("lr", "weight_decay", "adamw_eps"):
            _checks.non_negative(owner, name, group[name])
        _checks.beta(owner, "momentum", group["momentum"])
        _checks.positive_int(owner, "ns_steps", group["ns_steps"])
        _checks.betas(owner, "adamw_betas", group["adamw_betas"])

    # ---- the parts a subclass defines

    def _momentum(self, group: dict, grads: list, states: list, outs: list) -> None:
        """Update the momentum state of same-shaped matrices; write the Newton-Schulz inputs to outs."""
        raise NotImplementedError

    def _scale(self, rows: int, cols: int) -> float:
        raise NotImplementedError

    def _before_step(self) -> None:
        pass

    def _after_step(self, matrices: list) -> None:
        pass

    # ---- the step

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._before_step()
        stepped = []
        for group in self.param_groups:
            matrices, others = [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                _checks.dense_grad(self.owner, p)
                (matrices if group["use_muon"] and p.ndim >= 2 else others).append(p)
            if matrices:
                self._matrix_step(group, matrices)
                stepped.extend(matrices)
            if others:
                self._adamw_step(group, others)
        self._after_step(stepped)
        return loss

    def _matrix_step(self, group: dict, params: list) -> None:
        buckets = defaultdict(list)
        for p in params:
            ensure_buffers(self.state[p], p, self.matrix_buffers)
            buckets[(matrix_shape(p), p.device, p.dtype)].append(p)
        for ((rows, cols), device, _), ps in buckets.items():
            X = torch.empty((len(ps), rows, cols), dtype=torch.bfloat16, device=device)
            self._momentum(
                group, [as_matrix(p.grad) for p in ps], [self.state[p] for p in ps], list(X.unbind(0))
            )
            O = orthogonalize_(X, steps=group["ns_steps"], eps=self.ns_eps, form=self.ns_form)
            apply_orthogonal_update_(
                ps, O, lr=group["lr"], weight_decay=group["weight_decay"], scale=self._scale(rows, cols)
            )

    def _adamw_step(self, group: dict, params: list) -> None:
        buckets = defaultdict(list)
        for p in params:
            state = self.state[p]
            state.setdefault("step", 0)
            ensure_buffers(state, p, ("exp_avg", "exp_avg_sq"))
            state["step"] += 1
            buckets[(p.device, p.dtype, state["step"])].append(p)
        beta1, beta2 = group["adamw_betas"]
        for (_, _, step), ps in buckets.items():
            grads = [p.grad for p in ps]
            exp_avgs = [self.state[p]["exp_avg"] for p in ps]
            exp_avg_sqs = [self.state[p]["exp_avg_sq"] for p in ps]
            impl = _kernels.select(self.fused, ps, grads, exp_avgs)
            impl.adamw_(
                ps,
                grads,
                exp_avgs,
                exp_avg_sqs,
                lr=group["lr"],
                weight_decay=group["weight_decay"],
                beta1=beta1,
                beta2=beta2,
                step=step,
                eps=group["adamw_eps"],
                eps_form=self.adamw_eps_form,
            )

    def _buffers_of(self, states: list, name: str) -> list:
        return [as_matrix(s[name]) for s in states]


class Muon(MatrixOptimizer):
    r"""Muon (Jordan et al., 2024) as run in the MARS paper's baseline.

    Matrices: SGD momentum with Nesterov, quintic Newton-Schulz (reference form, bfloat16), update
    scaled by sqrt(max(1, rows/cols)), decoupled weight decay::

        buf <- mu buf + g;   u = g + mu buf (nesterov) or buf
        x   <- x (1 - lr wd) - lr sqrt(max(1, rows/cols)) NS(u)

    Other tensors (embeddings, head, 1-D: use `param_groups(model, "muon")`): AdamW with their
    group's lr and weight_decay, which default to adamw_lr and adamw_wd (the reference: 3e-3, 0.1,
    betas (0.9, 0.95)). State: "momentum_buffer" per matrix (4 bytes/param in float32);
    "exp_avg", "exp_avg_sq", "step" per AdamW tensor.

        opt = Muon(param_groups(model, "muon"), lr=0.02)   # or Muon(muon_params=..., adamw_params=...)
    """

    owner = "Muon"

    def __init__(
        self,
        params=None,
        lr=0.02,
        momentum=0.95,
        nesterov=True,
        ns_steps=5,
        weight_decay=0.0,
        *,
        muon_params=None,
        adamw_params=None,
        adamw_lr=3e-3,
        adamw_betas=(0.9, 0.95),
        adamw_eps=1e-8,
        adamw_wd=0.1,
        fused=None,
    ):
        _checks.non_negative(self.owner, "adamw_lr", adamw_lr)
        _checks.non_negative(self.owner, "adamw_wd", adamw_wd)
        defaults = dict(
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            weight_decay=weight_decay,
            adamw_betas=tuple(adamw_betas),
            adamw_eps=adamw_eps,
        )
        super().__init__(
            params,
            muon_params,
            adamw_params,
            defaults,
            fused,
            adamw_group_defaults={"lr": adamw_lr, "weight_decay": adamw_wd},
        )

    def _validate(self, group: dict) -> None:
        super()._validate(group)
        _checks.flag(self.owner, "nesterov", group["nesterov"])

    def _momentum(self, group, grads, states, outs) -> None:
        bufs = self._buffers_of(states, "momentum_buffer")
        impl = _kernels.select(self.fused, grads, bufs)
        impl.sgd_momentum_(grads, bufs, outs, momentum=group["momentum"], nesterov=group["nesterov"])

    def _scale(self, rows: int, cols: int) -> float:
        return max(1.0, rows / cols) ** 0.5


class Moonlight(MatrixOptimizer):
    r"""Muon in the Moonlight form (Liu et al., 2025), MARS_SPEC section 3 with gamma = 0.

    Matrices: M <- beta M + (1 - beta) G; X <- X (1 - lr wd) - lr 0.2 sqrt(max(A, B)) NS(M), with the
    Moonlight Newton-Schulz (bfloat16) and the weight decay on the unscaled lr. nesterov=True
    orthogonalises (1 - beta) G + beta M instead (Moonshot's default; proportional to their
    g + mu buf). Other tensors: AdamW with the same lr and weight decay, adamw_betas and eps not
    bias-corrected: m / (eps + sqrt(v)) sqrt(1 - beta2^t) / (1 - beta1^t). Accepts the reference's
    keywords (lr, wd, muon_params, momentum, nesterov, ns_steps, adamw_params, adamw_betas, adamw_eps).
    State: "momentum_buffer" per matrix; "exp_avg", "exp_avg_sq", "step" per AdamW tensor.

        opt = Moonlight(param_groups(model, "moonlight"), lr=6e-3, wd=0.1)
    """

    owner = "Moonlight"
    ns_form = "moonlight"
    adamw_eps_form = "moonlight"

    def __init__(
        self,
        params=None,
        lr=1e-3,
        wd=0.1,
        muon_params=None,
        momentum=0.95,
        nesterov=False,
        ns_steps=5,
        adamw_params=None,
        adamw_betas=(0.9, 0.95),
        adamw_eps=1e-8,
        *,
        fused=None,
    ):
        defaults = dict(
            lr=lr,
            weight_decay=wd,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            adamw_betas=tuple(adamw_betas),
            adamw_eps=adamw_eps,
        )
        super().__init__(params, muon_params, adamw_params, defaults, fused)

    def _validate(self, group: dict) -> None:
        super()._validate(group)
        _checks.flag(self.owner, "nesterov", group["nesterov"])

    def _momentum(self, group, grads, states, outs) -> None:
        bufs = self._buffers_of(states, "momentum_buffer")
        impl = _kernels.select(self.fused, grads, bufs)
        impl.ema_momentum_(grads, bufs, outs, beta=group["momentum"], nesterov=group["nesterov"])

    def _scale(self, rows: int, cols: int) -> float:
        return 0.2 * max(rows, cols) ** 0.5
