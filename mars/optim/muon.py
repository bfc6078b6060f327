"""Muon and Moonlight (docs/algorithms.md sections 3 and 4), and the base they share with MARS-M."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor
from torch.optim import Optimizer

from mars import checks

from . import _kernels, rules
from ._contract import TorchContract, named_tensor
from ._dist import DistributedOptimizer
from ._step import BucketedStep, group_value
from .config import OptimizerConfig, each, reference_names
from .mup import MATRIX_MOONLIGHT, MATRIX_REFERENCE
from .registry import register

MATRIX, ADAMW = "matrix", "adamw"
NS_EPS = 1e-7  # the Newton-Schulz normalisation of Muon, Moonlight and MARS-M

# The values the matrix optimizers take: their constructors and configs check them (mars.optim.config).
VALUE_CHECKS = (
    each(checks.finite_non_negative, "lr", "weight_decay", "lr_1d", "weight_decay_1d", "eps"),
    each(checks.fraction, "momentum"),
    each(checks.fraction_pair, "betas_1d"),
    each(checks.whole, "ns_steps"),
    each(checks.flag, "nesterov", "use_muon"),
)


class MatrixOptimizer(BucketedStep, DistributedOptimizer, TorchContract, Optimizer):
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

    role_keys = ("use_muon",)
    value_checks = VALUE_CHECKS
    group_names = {"betas_1d": "adamw_betas", "eps": "adamw_eps"}  # the reference's group keys
    needs_previous_grads = False  # exact MARS-M overrides this
    orthogonalised = (MATRIX,)
    matrix_buffers: tuple[str, ...] = ("momentum_buffer",)

    def __init__(
        self,
        params,
        muon_params,
        adamw_params,
        defaults: dict,
        *,
        fused,
        process_group=None,
        options: dict | None = None,
        adamw_group_defaults: dict | None = None,
    ):
        """defaults: the param-group defaults (betas_1d and eps as adamw_betas and adamw_eps);
        adamw_group_defaults: those only the AdamW groups take (Muon's lr_1d, weight_decay_1d)."""
        self.fused = fused
        self.process_group = process_group
        self._adamw_group_defaults = adamw_group_defaults or {}
        super().__init__(self._collect(params, muon_params, adamw_params), defaults, options)
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
            parts = [(use_muon, params)]  # a use_muon that is not True or False is refused with the group
        subgroups = []
        for use, ps in parts:
            sub = dict(group, params=ps, use_muon=use)
            if not use:
                for key, value in self._adamw_group_defaults.items():
                    sub.setdefault(key, value)
            subgroups.append(sub)
        return subgroups

    def _role(self, p: Tensor, group: dict) -> str:
        return MATRIX if group["use_muon"] and p.ndim >= 2 else ADAMW

    def _buffers(self, role: str, group: dict, every: bool = False) -> tuple[str, ...]:
        return self.matrix_buffers if role == MATRIX else ("step", "exp_avg", "exp_avg_sq")

    def _update(self, group: dict, role: str, params: list, step, scales) -> None:
        """AdamW on the tensors that are not orthogonalised (embeddings, head, 1-D), with the group's
        lr and weight_decay."""
        self._adam(
            params,
            step,
            lr=group_value(group, "lr", params[0]),
            weight_decay=group_value(group, "weight_decay", params[0]),
            betas=group["adamw_betas"],
            eps=group["adamw_eps"],
            eps_form="moonlight" if self.form == "moonlight" else "torch",
        )

    def _ns_setting(self, group: dict) -> tuple[int, float]:
        return group["ns_steps"], NS_EPS

    def _momentum(self, group: dict, params: list, grads: list, outs: list, scales) -> None:
        """Update the momentum of same-shaped matrices (grads: local matrices) with `momentum_rule`; write
        the Newton-Schulz inputs to outs (MARS-M overrides this: c_t, with its clip scales)."""
        bufs = self._buffers_of(params, "momentum_buffer")
        _kernels.update(
            self.momentum_rule,
            [grads, bufs],
            [bufs, outs],
            fused=self.fused,
            gate=self._gate,
            options={"nesterov": group["nesterov"]},
            beta=group["momentum"],
        )


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
    momentum_rule = staticmethod(rules.sgd_momentum)

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
            fused=fused,
            process_group=process_group,
            options=dict(lr_1d=lr_1d, weight_decay_1d=weight_decay_1d),
            adamw_group_defaults={"lr": lr_1d, "weight_decay": weight_decay_1d},
        )


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
    momentum_rule = staticmethod(rules.ema_momentum)
    form = "moonlight"

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
        super().__init__(
            params, muon_params, adamw_params, defaults, fused=fused, process_group=process_group
        )


@dataclass
class MuonConfig(OptimizerConfig):
    """optimizer=muon: the GPT-2 small reference run's values (docs/algorithms.md section 6)."""

    name: str = "muon"
    lr: float = 2e-2
    weight_decay: float = 0.0
    momentum: float = 0.95  # Nesterov momentum
    nesterov: bool = True
    ns_steps: int = 5  # Newton-Schulz iterations
    lr_1d: float = 3e-3  # the AdamW side (embeddings, head, 1-D tensors)
    betas_1d: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay_1d: float = 0.1
    eps: float = 1e-8
    fused: bool | None = None
    value_checks = VALUE_CHECKS


@dataclass
class MoonlightConfig(OptimizerConfig):
    """optimizer=moonlight, as in the MARS-M paper's GPT-2 small runs (decoupled weight decay on the
    unscaled lr, update scale 0.2 sqrt(max(A, B))); nesterov: true gives Moonshot's variant. The AdamW
    side takes the same lr and weight decay, and betas_1d."""

    name: str = "moonlight"
    lr: float = 6e-3
    weight_decay: float = 0.1
    momentum: float = 0.95
    nesterov: bool = False
    ns_steps: int = 5
    betas_1d: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    fused: bool | None = None
    value_checks = VALUE_CHECKS


register("muon", MuonConfig, Muon, grouping="matrix", mup=MATRIX_REFERENCE)
register("moonlight", MoonlightConfig, Moonlight, grouping="matrix", mup=MATRIX_MOONLIGHT)
