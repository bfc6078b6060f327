"""MARS-M: MARS variance reduction on the Moonlight form of Muon (docs/algorithms.md section 3)."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import _checks, _kernels, rules
from ._common import as_matrix, traced
from ._correction import Diagnostics, Work, scales_and_stats
from ._dist import local
from ._exact import PreviousGradsMixin
from .config import ConfigChecks, GammaScheduleConfig
from .muon import MatrixOptimizer
from .registry import reference_names, register


class MARSM(PreviousGradsMixin, MatrixOptimizer):
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
    instance_options = ("is_approx", "lean")
    ns_form = "moonlight"
    adamw_eps_form = "moonlight"
    correction = staticmethod(rules.correction)  # c_t: override in a subclass for a variant

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
        _checks.flag(self.owner, "approx", approx)
        _checks.correction(self.owner, type(self))
        _checks.flag(self.owner, "lean", lean)
        _checks.flag(self.owner, "diagnostics", diagnostics)
        if lean and diagnostics:
            raise ValueError(
                f"{self.owner}: invalid diagnostics=True with lean=True: the lean variant keeps no previous "
                "gradient to measure c_t against; set lean=False"
            )
        if clip_c is None:
            clip_c = not lean
        if lean and clip_c:
            raise ValueError(
                f"{self.owner}: invalid clip_c=True with lean=True: the lean variant is the "
                "unclipped approximate MARS-M; drop clip_c or set lean=False"
            )
        if lean and not approx:
            raise ValueError(
                f"{self.owner}: invalid approx=False with lean=True: the lean variant is approximate only"
            )
        if lean and not rules.is_linear(self.correction):
            raise ValueError(
                f"{self.owner}: invalid lean=True with {type(self).__name__}.correction: the lean variant "
                "is derived from a c_t linear in (g, g_prev), c = x g + y g_prev, and this one is not; "
                "set lean=False"
            )
        self.is_approx = approx
        self.lean = lean
        self.diagnostics = diagnostics
        self._diagnostics = Diagnostics()
        self._stashed = False
        self.matrix_buffers = ("momentum_buffer",) if lean else ("momentum_buffer", "last_grad")
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            ns_steps=ns_steps,
            adamw_betas=tuple(betas_1d),
            adamw_eps=eps,
            gamma=gamma,
            clip_c=clip_c,
        )
        super().__init__(params, muon_params, adamw_params, defaults, fused, process_group=process_group)

    def _validate_group(self, group: dict) -> None:
        super()._validate_group(group)
        _checks.non_negative(self.owner, "gamma", group["gamma"])
        _checks.flag(self.owner, "clip_c", group["clip_c"])
        if self.lean and group["momentum"] == 0:
            raise ValueError(
                f"{self.owner}: invalid momentum=0 with lean=True: the lean update divides by it"
            )
        if self.lean and group["clip_c"]:
            raise ValueError(f"{self.owner}: invalid clip_c=True in a param group with lean=True")

    def _takes_previous_grad(self, p, group) -> bool:
        return self._is_matrix(p, group)

    def _buffer_names(self, p, group) -> set[str]:
        names = super()._buffer_names(p, group)
        if self._is_matrix(p, group) and not self.is_approx:
            names.add("previous_grad")
        return names

    def _infer_options(self, entries) -> dict:
        matrices = [buffers for p, group, buffers in entries if self._is_matrix(p, group)]
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

    def _clip_scales(self, matrices: list) -> list:
        """Per bucket, the clip `scale` of its momentum (mars.optim._correction.scales_and_stats), and
        the diagnostics; 1.0 (no clip) for the lean variant."""
        if self.lean:
            return [1.0] * len(matrices)
        work = [
            Work(
                grads=[as_matrix(local(p.grad)) for p in params],
                prevs=[as_matrix(local(self.state[p]["last_grad"])) for p in params],
                correction=self.correction,
                gamma=traced(group["gamma"], params[0]),
                beta=group["momentum"],
                clip=group["clip_c"],
                fused=self.fused,
            )
            for group, _, params in matrices
        ]
        return scales_and_stats(work, self._sharding(), self._diagnostics if self.diagnostics else None)

    def _momentum(self, group, grads, states, outs, scales) -> None:
        bufs = self._buffers_of(states, "momentum_buffer")
        gamma, beta = traced(group["gamma"], grads[0]), group["momentum"]
        if self.lean:
            a, b = rules.lean_coefficients(self.correction, gamma, beta)
            _kernels.update(
                rules.lean_momentum, [grads, bufs], [bufs, outs], fused=self.fused, beta=beta, a=a, b=b
            )
            return
        prevs = self._buffers_of(states, "last_grad")
        _kernels.update(
            rules.mars_momentum,
            [grads, prevs, bufs],
            [bufs, outs, prevs],
            fused=self.fused,
            options={"correction": self.correction},
            gamma=gamma,
            beta=beta,
            scale=scales,
            out_scale=1.0,
        )

    def read_diagnostics(self) -> dict[str, float]:
        """The MARS diagnostics since the last call (diagnostics=True; see mars.optim._correction)."""
        return self._diagnostics.read()

    def _scale(self, rows: int, cols: int) -> float:
        return 0.2 * max(rows, cols) ** 0.5

    def _before_step(self) -> None:
        self._check_stashed()

    def _after_step(self, matrices: list) -> None:
        if not self.is_approx:
            self._rotate_previous_grads(matrices)


@dataclass
class MARSMConfig(ConfigChecks):
    """optimizer=mars_m. GPT-2 small (docs/algorithms.md sections 3 and 6): lr 6e-3, momentum 0.95,
    gamma 0.025, wd 0.01, clip on; embeddings, head and 1-D tensors take AdamW with the same lr and wd
    and betas_1d. Exact mode: approx=false; one-buffer variant: lean=true (unclipped, approximate)."""

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

    def validate(self) -> None:
        self._non_negative("lr", "weight_decay", "gamma", "eps")
        self._fraction("momentum")
        self._pair_of_fractions("betas_1d")
        self._at_least_one("ns_steps")
        self.gamma_schedule.validate(self.gamma)
        if self.lean:
            if self.clip_c:
                self._fail(
                    "clip_c", "cannot be true with lean=true: the lean variant is the unclipped MARS-M"
                )
            if not self.approx:
                self._fail("approx", "must be true with lean=true: the lean variant is approximate only")
            if self.diagnostics:
                self._fail("diagnostics", "needs lean=false: the lean variant keeps no previous gradient")
            if self.momentum == 0:
                self._fail("momentum", "must be > 0 with lean=true: the lean update divides by it")


register("mars_m", MARSMConfig, MARSM, grouping="matrix", trainer_keys=("gamma_schedule",))
