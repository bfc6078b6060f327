"""MARS-M: MARS variance reduction on the Moonlight form of Muon (docs/algorithms.md section 3)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mars import checks

from . import _kernels, rules
from ._correction import CorrectionMixin
from ._step import group_value
from .config import GammaScheduleConfig, OptimizerConfig, each, reference_names
from .muon import MATRIX, VALUE_CHECKS, MatrixOptimizer
from .mup import MATRIX_MOONLIGHT
from .registry import register

# What the lean variant (lean=true), the unclipped approximate MARS-M with one buffer, refuses:
# (key, refused(value), why)
LEAN_RULES = (
    ("clip_c", bool, "cannot be true with lean=true: the lean variant is the unclipped MARS-M; drop clip_c"),
    ("approx", lambda v: v is False, "must be true with lean=true: the lean variant is approximate only"),
    ("diagnostics", bool, "needs lean=false: the lean variant keeps no g_prev to measure c_t against"),
    ("momentum", lambda v: v == 0, "must be > 0 with lean=true: the lean update divides by it"),
)


def lean_checks(values):
    if values.get("lean") is True:
        for key, refused, why in LEAN_RULES:
            if key in values and refused(values[key]):
                yield key, values[key], why


# MARS-M's values: the matrix optimizers', gamma, its flags and the lean variant's (mars.optim.config)
MARS_M_CHECKS = (
    *VALUE_CHECKS,
    each(checks.finite_non_negative, "gamma"),
    each(checks.flag, "clip_c", "approx", "lean", "diagnostics"),
    lean_checks,
)


class MARSM(CorrectionMixin, MatrixOptimizer):
    r"""MARS-M (Liu, Yuan, Gu, 2025). For hidden weight matrices, with k = gamma beta / (1 - beta)::

        C  = G + k (G - G_prev)           `correction`; G_prev: approx = last step's G; exact =
                                          grad f(X_{t-1}, xi_t)
        C~ = C / ||C||_F if ||C||_F > 1   (clip_c=True, the default; the reference always clips)
        M  = beta M + (1 - beta) C~
        X <- X (1 - lr wd) - lr 0.2 sqrt(max(A, B)) NS(M)     Moonlight Newton-Schulz, bfloat16

    beta is `momentum`. Other tensors (embeddings, head, 1-D; see `param_groups(model, "mars_m")`)
    take the Moonlight AdamW (same lr and weight decay, betas_1d, eps not bias-corrected).
    gamma = 0 with clip_c=False is Moonlight (nesterov=False).

    lean=True is the one-buffer approximate variant without clipping: buf <- mu buf + b G,
    O = NS(a G + mu buf), algebraically the unclipped approximate MARS-M, with (a, b) derived from
    `correction` (mars.optim.rules.lean_coefficients; for MARS's c_t a = gamma, b = (1 - gamma)
    (1 - mu) / mu). It needs momentum > 0, approx=True and a c_t linear in (G, G_prev).

    Another c_t: subclass MARSM and override the static method `correction(g, g_prev, gamma, beta)`
    (beta = momentum), as for `mars.optim.MARS` (see its docstring); the clip, the diagnostics and
    the lean variant all follow it (a lean variant of a c_t that is not linear is refused).

    The keywords are the `optimizer.*` config keys (weight_decay, betas_1d, eps, approx); the
    reference's positional order and names are accepted too: MARSM(lr=..., wd=..., muon_params=...,
    adamw_params=..., momentum=0.95, ns_steps=5, adamw_betas=(0.9, 0.95), adamw_eps=1e-8,
    gamma=0.025, clip_c=..., is_approx=True), as well as param groups (keys lr, weight_decay or wd,
    momentum, ns_steps, adamw_betas, adamw_eps, gamma, clip_c, use_muon). gamma is read from the
    group every step.

    Approximate mode keeps a copy of each matrix's last gradient ("last_grad"; 8 bytes/param in
    float32 with "momentum_buffer"; 4 with lean). Exact mode (approx=False) follows the protocol
    of `mars.optim.MARS`: before every step() compute the next batch's gradient at the current
    weights, call `stash_previous_grads()`, zero the grads, compute the step's gradient, `step()`.
    Non-finite gradients are not detected (no host sync): they propagate into the state and weights.
    state_dict() records is_approx and lean; loading a state dict saved with other values (or by
    another optimizer) raises a ValueError saying so.
    """

    owner = "MARSM"
    value_checks = MARS_M_CHECKS
    instance_options = ("is_approx", "lean")
    form = "moonlight"

    @reference_names
    def __init__(
        self,
        params=None,
        lr=1e-3,
        weight_decay=0.1,
        muon_params=None,
        momentum=0.95,
        ns_steps=5,
        adamw_params=None,
        betas_1d=(0.9, 0.95),
        eps=1e-8,
        gamma=0.025,
        clip_c=None,
        approx=True,
        *,
        lean=False,
        fused=None,
        diagnostics=False,
        process_group=None,
    ):
        self._correction_init(approx, diagnostics)
        self.lean = lean
        self.matrix_buffers = ("momentum_buffer",) if lean else ("momentum_buffer", "last_grad")
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            ns_steps=ns_steps,
            adamw_betas=tuple(betas_1d),
            adamw_eps=eps,
            gamma=gamma,
            clip_c=(not lean) if clip_c is None else clip_c,  # None: on, but for the lean variant
        )
        options = dict(approx=approx, lean=lean, diagnostics=diagnostics)
        super().__init__(
            params,
            muon_params,
            adamw_params,
            defaults,
            fused=fused,
            process_group=process_group,
            options=options,
        )
        if lean and not rules.is_linear(self.correction):
            raise ValueError(
                f"{self.owner}: invalid lean=True with {type(self).__name__}.correction: the lean variant "
                "is derived from a c_t linear in (g, g_prev), c = x g + y g_prev, and this one is not; "
                "set lean=False"
            )

    @property
    def g_prev_roles(self) -> tuple[str, ...]:
        return () if self.lean else (MATRIX,)

    def _beta(self, group: dict) -> float:
        return group["momentum"]

    def _infer_options(self, entries) -> dict:
        matrices = [buffers for p, group, buffers in entries if self._role(p, group) == MATRIX]
        if any("previous_grad" in b for b in matrices):
            return {"is_approx": (False, "'previous_grad' buffers (exact mode)")}
        if any("last_grad" in b for b in matrices):
            return {
                "is_approx": (True, "'last_grad' buffers without 'previous_grad' (approximate mode)"),
                "lean": (False, "'last_grad' buffers (two buffers per matrix)"),
            }
        if any("momentum_buffer" in b for b in matrices):
            return {"lean": (True, "matrices with 'momentum_buffer' alone (the one-buffer variant)")}
        return {}

    def _momentum(self, group, params, grads, outs, scales) -> None:
        bufs = self._buffers_of(params, "momentum_buffer")
        gamma, beta = group_value(group, "gamma", grads[0]), group["momentum"]
        if self.lean:
            a, b = rules.lean_coefficients(self.correction, gamma, beta)
            _kernels.update(
                rules.lean_momentum,
                [grads, bufs],
                [bufs, outs],
                fused=self.fused,
                gate=self._gate,
                beta=beta,
                a=a,
                b=b,
            )
            return
        self._corrected_momentum(params, grads, bufs, outs, gamma, beta, scales, out_scale=1.0)


@dataclass
class MARSMConfig(OptimizerConfig):
    """optimizer=mars_m: the GPT-2 small values (docs/algorithms.md sections 3 and 6); embeddings, head and
    1-D tensors take AdamW with the same lr and weight decay, and betas_1d. Exact mode: approx=false;
    one-buffer variant: lean=true (unclipped, approximate)."""

    name: str = "mars_m"
    lr: float = 6e-3
    weight_decay: float = 0.01
    momentum: float = 0.95
    gamma: float = 0.025  # peak gamma; gamma_schedule shapes it over the steps (the trainer drives it)
    gamma_schedule: GammaScheduleConfig = field(default_factory=GammaScheduleConfig)
    approx: bool = True
    clip_c: bool | None = None  # None: on, except with lean=true (the lean variant has no clip)
    lean: bool = False
    ns_steps: int = 5
    betas_1d: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    diagnostics: bool = False
    fused: bool | None = None
    value_checks = MARS_M_CHECKS


register(
    "mars_m", MARSMConfig, MARSM, grouping="matrix", trainer_keys=("gamma_schedule",), mup=MATRIX_MOONLIGHT
)
