"""Muon and Moonlight (docs/algorithms.md sections 3 and 4), and the machinery they share with MARS-M."""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.optim import Optimizer

from . import _checks, _kernels, rules
from ._common import (
    adam_hyper,
    advance_steps,
    apply_orthogonal_update_,
    as_matrix,
    bucket_step,
    ensure_buffers,
    matrix_shape,
    step_counter,
    traced,
)
from ._contract import TorchContract, named_tensor
from ._dist import DistributedOptimizer, local
from .config import ConfigChecks
from .newton_schulz import orthogonalize_
from .registry import reference_names, register

MATRIX, ADAMW = "matrix", "adamw"


class MatrixOptimizer(DistributedOptimizer, TorchContract, Optimizer):
    """Base of Muon, Moonlight and MARS-M: matrices get an orthogonalised momentum step, the rest AdamW.

    Param groups carry "use_muon": True for hidden weight matrices (tensors of fewer than 2 dims in
    such a group still take AdamW), False for the AdamW tensors (the reference sends embeddings, the
    output head and 1-D tensors there). A group without the flag is split by ndim (>= 2: matrices);
    embeddings and heads cannot be recognised that way, so build groups with
    `mars.optim.param_groups(model, name)` or pass muon_params= / adamw_params= (the reference form).
    Same-shaped matrices of a group share one batched Newton-Schulz (bfloat16 by design; the update is
    applied in the parameter's dtype); the elementwise arithmetic runs in float64 for float64 tensors,
    float32 otherwise. Tensors whose grad is None, or with no entries, are skipped; non-finite
    gradients are not detected and propagate into the state and the parameters. Parameters may be
    given with names (model.named_parameters(), or (name, tensor) pairs in a group), as to torch's
    optimizers. state_dict() records the class (and MARS-M's is_approx and lean); loading a state
    dict of another optimizer, or with another use_muon for a group, raises a ValueError saying so.
    """

    owner = "MatrixOptimizer"
    role_keys = ("use_muon",)
    needs_previous_grads = False  # exact MARS-M overrides this
    ns_form = "reference"
    ns_eps = 1e-7
    adamw_eps_form = "torch"
    matrix_buffers: tuple[str, ...] = ("momentum_buffer",)

    def __init__(
        self,
        params,
        muon_params,
        adamw_params,
        defaults: dict,
        fused,
        adamw_group_defaults=None,
        process_group=None,
    ):
        self.fused = fused
        self.process_group = process_group
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

    def _split_param_group(self, param_group: dict) -> list[dict]:
        """A group without "use_muon" becomes two: matrices (ndim >= 2) and the rest. Parameters may
        be (name, tensor) pairs; names stay with their tensors."""
        if not isinstance(param_group, dict):
            return [param_group]  # torch's add_param_group names the problem
        group = dict(param_group)
        if "wd" in group:  # the reference's key
            if "weight_decay" in group:
                raise ValueError(f"{self.owner}: a param group has both 'wd' and 'weight_decay'; keep one")
            group["weight_decay"] = group.pop("wd")
        params = group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        names = group.pop("param_names", None)
        if names is not None and len(names) == len(params) and not any(isinstance(p, tuple) for p in params):
            params = list(zip(names, params, strict=True))
        elif names is not None:
            group["param_names"] = names  # torch reports the mismatch
        use_muon = group.get("use_muon")
        if use_muon is None:
            matrices = [p for p in params if named_tensor(p).ndim >= 2]
            others = [p for p in params if named_tensor(p).ndim < 2]
            parts = [(use, ps) for use, ps in ((True, matrices), (False, others)) if ps] or [(True, params)]
        else:
            _checks.flag(self.owner, "use_muon", use_muon)
            parts = [(use_muon, params)]
        subgroups = []
        for use, ps in parts:
            sub = dict(group, params=ps, use_muon=use)
            if not use:
                for key, value in self._adamw_group_defaults.items():
                    sub.setdefault(key, value)
            subgroups.append(sub)
        return subgroups

    def _validate_group(self, group: dict) -> None:
        owner = self.owner
        for name in ("lr", "weight_decay", "adamw_eps"):
            _checks.non_negative(owner, name, group[name])
        _checks.beta(owner, "momentum", group["momentum"])
        _checks.positive_int(owner, "ns_steps", group["ns_steps"])
        _checks.betas(owner, "adamw_betas", group["adamw_betas"])

    def _is_matrix(self, p: Tensor, group: dict) -> bool:
        return group["use_muon"] and p.ndim >= 2

    def _buffer_names(self, p, group) -> set[str]:
        if self._is_matrix(p, group):
            return set(self.matrix_buffers)
        return {"exp_avg", "exp_avg_sq", "step"}

    # ---- the parts a subclass defines

    def _momentum(self, group: dict, grads: list, states: list, outs: list, scales) -> None:
        """Update the momentum state of same-shaped matrices; write the Newton-Schulz inputs to outs.
        grads and outs are (local) matrices; scales: MARS-M's clip scales (1.0 elsewhere)."""
        raise NotImplementedError

    def _scale(self, rows: int, cols: int) -> float:
        raise NotImplementedError

    def _before_step(self) -> None:
        pass

    def _after_step(self, matrices: list) -> None:
        pass

    # ---- the step

    def step(self, closure=None):
        """One step on every tensor with a gradient (tensors whose grad is None are skipped); returns
        the closure's loss when a closure is given."""
        return self._step(closure)

    @torch.no_grad()
    def _step(self, closure=None):
        """AdamW on the non-matrices (local shards); the matrices' momentum (and MARS-M's clip scales,
        from whole-tensor norms) into bfloat16 Newton-Schulz inputs; one Newton-Schulz over all of the
        step's matrices (divided over ranks when sharded or replicated); then the matrix updates."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._before_step()
        matrices = []
        for group in self.param_groups:
            for key, params in self._buckets(group).items():
                if key[0] == MATRIX:
                    matrices.append((group, key, params))
                else:
                    self._adamw_update(group, key, params)
        scales = self._clip_scales(matrices)
        inputs = [
            self._matrix_momentum(group, params, sc)
            for (group, _, params), sc in zip(matrices, scales, strict=True)
        ]
        by_steps = defaultdict(list)
        for i, (group, _, _) in enumerate(matrices):
            by_steps[group["ns_steps"]].append(i)
        for steps, idx in by_steps.items():
            ns = functools.partial(orthogonalize_, steps=steps, eps=self.ns_eps, form=self.ns_form)
            results = self._orthogonalize([inputs[i] for i in idx], [matrices[i][1][1] for i in idx], ns)
            for i, O in zip(idx, results, strict=True):
                group, (_, (rows, cols), _, _), params = matrices[i]
                lr, weight_decay = traced(group["lr"], params[0]), traced(group["weight_decay"], params[0])
                apply_orthogonal_update_(
                    [local(p) for p in params],
                    O,
                    lr=lr,
                    weight_decay=weight_decay,
                    scale=self._scale(rows, cols),
                )
        self._after_step([p for _, _, params in matrices for p in params])
        return loss

    def _clip_scales(self, matrices: list) -> list:
        """Per matrix bucket, the clip scales of c (MARS-M): 0-dim tensors, or 1.0 (no clip)."""
        return [1.0] * len(matrices)

    def _matrix_momentum(self, group: dict, params: list, scales) -> torch.Tensor:
        """The momentum update of a bucket of same-shaped matrices; returns their bfloat16 Newton-Schulz
        inputs (n, rows here, cols): this rank's pieces when sharded."""
        grads = [as_matrix(local(p.grad)) for p in params]
        X = torch.empty((len(params), *grads[0].shape), dtype=torch.bfloat16, device=grads[0].device)
        self._momentum(group, grads, [self.state[p] for p in params], list(X.unbind(0)), scales)
        return X

    def _buckets(self, group: dict) -> dict[tuple, list]:
        """The group's tensors with a gradient: matrices by (MATRIX, (rows, cols), device, dtype), one
        batched Newton-Schulz each; the rest by (ADAMW, device, dtype, step count), one AdamW kernel
        call each. Creates the missing state buffers."""
        buckets = defaultdict(list)
        for p in group["params"]:
            if p.grad is None or p.numel() == 0:
                continue
            _checks.dense_grad(self.owner, p)
            state = self.state[p]
            if self._is_matrix(p, group):
                ensure_buffers(state, p, self.matrix_buffers)
                buckets[(MATRIX, matrix_shape(p), p.device, p.dtype)].append(p)
            else:
                count = step_counter(state)
                ensure_buffers(state, p, ("exp_avg", "exp_avg_sq"))
                buckets[(ADAMW, p.device, p.dtype, bucket_step(count))].append(p)
        return buckets

    def _adamw_update(self, group: dict, key: tuple, ps: list) -> None:
        step = advance_steps([self.state[p] for p in ps], key[-1])
        params = [local(p) for p in ps]
        m = [local(self.state[p]["exp_avg"]) for p in ps]
        v = [local(self.state[p]["exp_avg_sq"]) for p in ps]
        adam = adam_hyper(
            lr=traced(group["lr"], ps[0]),
            weight_decay=traced(group["weight_decay"], ps[0]),
            betas=group["adamw_betas"],
            eps=group["adamw_eps"],
            step=step,
            params=params,
            eps_form=self.adamw_eps_form,
        )
        grads = [local(p.grad) for p in ps]
        _kernels.update(rules.adamw, [params, grads, m, v], [params, m, v], fused=self.fused, **adam)

    def _buffers_of(self, states: list, name: str) -> list:
        return [as_matrix(local(s[name])) for s in states]


class Muon(MatrixOptimizer):
    r"""Muon (Jordan et al., 2024) as run in the MARS paper's baseline.

    Matrices: SGD momentum with Nesterov, quintic Newton-Schulz (reference form, bfloat16), update
    scaled by sqrt(max(1, rows/cols)), decoupled weight decay::

        buf <- mu buf + g;   u = g + mu buf (nesterov) or buf
        x   <- x (1 - lr wd) - lr sqrt(max(1, rows/cols)) NS(u)

    Other tensors (embeddings, head, 1-D: use `param_groups(model, "muon")`): AdamW with their
    group's lr and weight_decay, which default to lr_1d and weight_decay_1d (the reference's adamw_lr
    and adamw_wd: 3e-3, 0.1), betas_1d (0.9, 0.95) and eps; the reference's keyword names (adamw_lr,
    adamw_betas, adamw_eps, adamw_wd) are accepted too. State: "momentum_buffer" per matrix (4
    bytes/param in float32); "exp_avg", "exp_avg_sq", "step" per AdamW tensor.

        opt = Muon(param_groups(model, "muon"), lr=0.02)   # or Muon(muon_params=..., adamw_params=...)
    """

    owner = "Muon"

    @reference_names
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
        lr_1d=3e-3,
        betas_1d=(0.9, 0.95),
        eps=1e-8,
        weight_decay_1d=0.1,
        fused=None,
        process_group=None,
    ):
        _checks.non_negative(self.owner, "lr_1d", lr_1d)
        _checks.non_negative(self.owner, "weight_decay_1d", weight_decay_1d)
        defaults = dict(
            lr=lr,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            weight_decay=weight_decay,
            adamw_betas=tuple(betas_1d),
            adamw_eps=eps,
        )
        super().__init__(
            params,
            muon_params,
            adamw_params,
            defaults,
            fused,
            adamw_group_defaults={"lr": lr_1d, "weight_decay": weight_decay_1d},
            process_group=process_group,
        )

    def _validate_group(self, group: dict) -> None:
        super()._validate_group(group)
        _checks.flag(self.owner, "nesterov", group["nesterov"])

    def _momentum(self, group, grads, states, outs, scales) -> None:
        bufs = self._buffers_of(states, "momentum_buffer")
        _kernels.update(
            rules.sgd_momentum,
            [grads, bufs],
            [bufs, outs],
            fused=self.fused,
            options={"nesterov": group["nesterov"]},
            momentum=group["momentum"],
        )

    def _scale(self, rows: int, cols: int) -> float:
        return max(1.0, rows / cols) ** 0.5


class Moonlight(MatrixOptimizer):
    r"""Muon in the Moonlight form (Liu et al., 2025), docs/algorithms.md section 3 with gamma = 0.

    Matrices: M <- beta M + (1 - beta) G; X <- X (1 - lr wd) - lr 0.2 sqrt(max(A, B)) NS(M), with the
    Moonlight Newton-Schulz (bfloat16) and the weight decay on the unscaled lr. nesterov=True
    orthogonalises (1 - beta) G + beta M instead (Moonshot's default; proportional to their
    g + mu buf). Other tensors: AdamW with the same lr and weight decay, betas_1d and eps not
    bias-corrected: m / (eps + sqrt(v)) sqrt(1 - beta2^t) / (1 - beta1^t). Accepts the reference's
    positional order and keywords (lr, wd, muon_params, momentum, nesterov, ns_steps, adamw_params,
    adamw_betas, adamw_eps); this package's names are weight_decay, betas_1d and eps.
    State: "momentum_buffer" per matrix; "exp_avg", "exp_avg_sq", "step" per AdamW tensor.

        opt = Moonlight(param_groups(model, "moonlight"), lr=6e-3, weight_decay=0.1)
    """

    owner = "Moonlight"
    ns_form = "moonlight"
    adamw_eps_form = "moonlight"

    @reference_names
    def __init__(
        self,
        params=None,
        lr=1e-3,
        weight_decay=0.1,
        muon_params=None,
        momentum=0.95,
        nesterov=False,
        ns_steps=5,
        adamw_params=None,
        betas_1d=(0.9, 0.95),
        eps=1e-8,
        *,
        fused=None,
        process_group=None,
    ):
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_steps=ns_steps,
            adamw_betas=tuple(betas_1d),
            adamw_eps=eps,
        )
        super().__init__(params, muon_params, adamw_params, defaults, fused, process_group=process_group)

    def _validate_group(self, group: dict) -> None:
        super()._validate_group(group)
        _checks.flag(self.owner, "nesterov", group["nesterov"])

    def _momentum(self, group, grads, states, outs, scales) -> None:
        bufs = self._buffers_of(states, "momentum_buffer")
        _kernels.update(
            rules.ema_momentum,
            [grads, bufs],
            [bufs, outs],
            fused=self.fused,
            options={"nesterov": group["nesterov"]},
            beta=group["momentum"],
        )

    def _scale(self, rows: int, cols: int) -> float:
        return 0.2 * max(rows, cols) ** 0.5


@dataclass
class MuonConfig(ConfigChecks):
    """optimizer=muon. GPT-2 small reference: lr 2e-2, wd 0, Nesterov momentum 0.95, 5 Newton-Schulz
    steps; embeddings, head and 1-D tensors take AdamW with lr_1d 3e-3, betas_1d (0.9, 0.95), wd 0.1."""

    name: str = "muon"
    lr: float = 2e-2
    weight_decay: float = 0.0
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    lr_1d: float = 3e-3  # the AdamW side (embeddings, head, 1-D tensors)
    betas_1d: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay_1d: float = 0.1
    eps: float = 1e-8
    fused: bool | None = None

    def validate(self) -> None:
        self._non_negative("lr", "weight_decay", "lr_1d", "weight_decay_1d", "eps")
        self._fraction("momentum")
        self._pair_of_fractions("betas_1d")
        self._at_least_one("ns_steps")


@dataclass
class MoonlightConfig(ConfigChecks):
    """optimizer=moonlight, as in the MARS-M paper's GPT-2 small runs: lr 6e-3, momentum 0.95, wd 0.1
    (decoupled, unscaled lr), update scale 0.2 sqrt(max(A, B)); no Nesterov (nesterov: true gives
    Moonshot's variant). The AdamW side uses the same lr and weight decay, and betas_1d."""

    name: str = "moonlight"
    lr: float = 6e-3
    weight_decay: float = 0.1
    momentum: float = 0.95
    nesterov: bool = False
    ns_steps: int = 5
    betas_1d: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    fused: bool | None = None

    def validate(self) -> None:
        self._non_negative("lr", "weight_decay", "eps")
        self._fraction("momentum")
        self._pair_of_fractions("betas_1d")
        self._at_least_one("ns_steps")


register("muon", MuonConfig, Muon, grouping="matrix")
register("moonlight", MoonlightConfig, Moonlight, grouping="matrix")
