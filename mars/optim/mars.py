"""MARS: MARS-AdamW, MARS-Lion and MARS-Shampoo, approximate and exact (docs/algorithms.md 1, 2, 5)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.optim import Optimizer

from mars import checks

from . import _kernels, rules
from ._contract import TorchContract
from ._correction import CorrectionMixin
from ._dist import DistributedOptimizer, local
from ._step import BucketedStep, group_value
from .config import GammaScheduleConfig, OptimizerConfig, each, reference_names
from .mup import ELEMENTWISE, NO_SHAMPOO
from .registry import register

MARS_TYPES = ("mars-adamw", "mars-lion", "mars-shampoo")
TWO_DIM_RULES = ("eq2", "ge2")
NS_STEPS = 5  # the reference's MARS-Shampoo runs five quintic Newton-Schulz iterations

# How a tensor is updated; see MARS._role.
ADAMW_1D, MARS_ADAMW, MARS_LION, MARS_NS = "adamw_1d", "mars_adamw", "mars_lion", "mars_ns"

# The values MARS takes: its constructor and its configs check them (mars.optim.config).
VALUE_CHECKS = (
    each(checks.finite_non_negative, "lr", "eps", "weight_decay", "gamma", "lr_1d", "weight_decay_1d"),
    each(checks.fraction_pair, "betas", "betas_1d"),
    each(checks.choice, "mars_type", args=(MARS_TYPES,)),
    each(checks.choice, "two_dim_rule", args=(TWO_DIM_RULES,)),
    each(checks.flag, "amsgrad", "optimize_1d", "clip_c", "approx", "diagnostics"),
)


class MARS(CorrectionMixin, BucketedStep, DistributedOptimizer, TorchContract, Optimizer):
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

    Approximate mode (approx=True, default): g_prev is a copy of the gradient this optimizer saw
    at its previous step (after the loop's gradient clipping), kept in its own buffer::

        model = torch.nn.Linear(8, 1)
        batches = [(torch.randn(4, 8), torch.randn(4, 1)) for _ in range(10)]
        loss_fn = lambda batch: torch.nn.functional.mse_loss(model(batch[0]), batch[1])
        opt = MARS(model.parameters(), lr=6e-3, weight_decay=0.01)
        for batch in batches:
            loss_fn(batch).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    Exact mode (approx=False; `needs_previous_grads` is True): two gradients per step, looking one
    batch ahead (docs/algorithms.md section 5)::

        opt = MARS(model.parameters(), lr=6e-3, weight_decay=0.01, approx=False)
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

    diagnostics=True computes, on the device, the figures of docs/algorithms.md section 8 (||c|| over
    the MARS tensors, the fraction clipped, the cosine between g and g_prev, ||c - g|| / ||g||) with
    one extra reduction pass; `read_diagnostics()` returns them (one host read) and resets. The
    updates are the same with diagnostics on or off.

    Sharded and replicated parameters: with FSDP2 (DTensor parameters, dim-0 shards) the updates run
    on each rank's shards, the clip of c uses the norm of the whole tensor (all tensors' local squared
    norms summed in one all-reduce per step) and MARS-Shampoo's Newton-Schulz runs on whole matrices,
    each at one owner rank (docs/algorithms.md section 9); the results equal the unsharded optimizer's.
    With DDP (every rank holds every parameter), pass process_group (e.g. torch.distributed.group.WORLD)
    to divide MARS-Shampoo's Newton-Schulz over the ranks instead of repeating it on each.

    Another c_t: subclass MARS and override the static method `correction(g, g_prev, gamma, beta)`
    (default: mars.optim.rules.correction, g + gamma beta / (1 - beta) (g - g_prev), beta = beta1).
    It is the only place c_t is defined: the clip norms, the diagnostics and every mars_type use it.
    It must be elementwise arithmetic that both implementations below can run (mars.optim.rules);
    register the class with a config to train it by name::

        class MARSPlain(MARS):
            @staticmethod
            def correction(g, g_prev, gamma, beta):
                return g + gamma * (g - g_prev)

        @dataclass
        class MARSPlainConfig(MARSConfig):
            name: str = "mars_plain"

        mars.optim.register("mars_plain", MARSPlainConfig, MARSPlain, grouping="decay",
                            trainer_keys=("gamma_schedule",), fixed={"mars_type": "mars-adamw"})

    Implementation: the update rules of mars.optim.rules, each tensor's update one kernel compiled
    with torch.compile where available, else multi-tensor torch._foreach_* ops over each bucket
    (fused=None picks; True requires the compiled kernels; False forces multi-tensor, as does an
    outer torch.compile of a training step, which fuses them itself). Neither reads any value back
    from the device. Arithmetic runs in float64 for float64 tensors and in float32 otherwise
    (bf16/fp16 storage); MARS-Shampoo's Newton-Schulz runs in bfloat16 by design and its update is
    applied in the parameter's dtype.
    Parameters must be real floating point (complex ones raise a ValueError at construction); tensors
    with no entries are skipped. Accepts named parameters (model.named_parameters()) like torch's
    optimizers; state_dict() then carries "param_names". The keywords are the `optimizer.*` config
    keys; the reference's positional order and its name is_approx (for approx) are accepted too.
    """

    owner = "MARS"
    value_checks = VALUE_CHECKS
    instance_options = ("is_approx",)
    role_keys = ("mars_type", "optimize_1d", "two_dim_rule")
    orthogonalised = (MARS_NS,)
    g_prev_roles = (MARS_ADAMW, MARS_LION, MARS_NS)

    @reference_names
    def __init__(
        self,
        params,
        lr=3e-3,
        betas=(0.95, 0.99),
        eps=1e-8,
        weight_decay=0.0,
        amsgrad=False,
        gamma=0.025,
        approx=True,
        mars_type="mars-adamw",
        optimize_1d=False,
        lr_1d=3e-3,
        betas_1d=(0.9, 0.95),
        weight_decay_1d=0.1,
        *,
        clip_c=True,
        two_dim_rule="eq2",
        fused=None,
        diagnostics=False,
        process_group=None,
    ):
        self._correction_init(approx, diagnostics)
        self.fused = fused
        self.process_group = process_group
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
        super().__init__(params, defaults, options=dict(approx=approx, diagnostics=diagnostics))
        _kernels.check_fused_flag(self.owner, fused, _kernels.first_device(self.param_groups))

    @staticmethod
    def _role(p, group) -> str:
        matrix = p.ndim == 2 if group["two_dim_rule"] == "eq2" else p.ndim >= 2
        if not (matrix or group["optimize_1d"]):
            return ADAMW_1D
        if group["mars_type"] == "mars-shampoo":
            return MARS_NS if matrix else MARS_ADAMW
        return MARS_LION if group["mars_type"] == "mars-lion" else MARS_ADAMW

    def _buffers(self, role: str, group: dict, every: bool = False) -> tuple[str, ...]:
        names = ("step", "exp_avg")
        if role in (ADAMW_1D, MARS_ADAMW):
            amsgrad = every or group["amsgrad"]
            names += ("exp_avg_sq", "max_exp_avg_sq") if amsgrad else ("exp_avg_sq",)
        return names if role == ADAMW_1D else (*names, "last_grad")

    def _beta(self, group: dict) -> float:
        return group["betas"][0]

    def _infer_options(self, entries) -> dict:
        mars_path = [buffers for p, group, buffers in entries if self._role(p, group) != ADAMW_1D]
        if any("previous_grad" in b for b in mars_path):
            return {"is_approx": (False, "'previous_grad' buffers (exact mode)")}
        if any("last_grad" in b for b in mars_path):
            return {"is_approx": (True, "'last_grad' buffers without 'previous_grad' (approximate mode)")}
        return {}

    def _update(self, group: dict, role: str, params: list, step, scales) -> None:
        """Run one elementwise bucket's rule (mars.optim.rules) on local shards. step: the bucket's step
        count, or (inside torch.compile) the list of its step counters; scales: its clip scales."""
        if role == ADAMW_1D:
            self._adam(
                params,
                step,
                lr=group_value(group, "lr_1d", params[0]),
                weight_decay=group_value(group, "weight_decay_1d", params[0]),
                betas=group["betas_1d"],
                eps=group["eps"],
                amsgrad=group["amsgrad"],
            )
            return
        lr, weight_decay = group_value(group, "lr", params[0]), group_value(group, "weight_decay", params[0])
        gamma = group_value(group, "gamma", params[0])
        if role == MARS_ADAMW:
            self._adam(
                params,
                step,
                lr=lr,
                weight_decay=weight_decay,
                betas=group["betas"],
                eps=group["eps"],
                amsgrad=group["amsgrad"],
                mars={"gamma": gamma, "scale": scales},
            )
            return
        ps = [local(p) for p in params]
        m = [local(self.state[p]["exp_avg"]) for p in params]
        prevs = [local(self.state[p]["last_grad"]) for p in params]
        _kernels.update(
            rules.mars_lion,
            [ps, [local(p.grad) for p in params], prevs, m],
            [ps, m, prevs],
            fused=self.fused,
            gate=self._gate,
            options={"correction": self.correction},
            gamma=gamma,
            scale=scales,
            lr=lr,
            weight_decay=weight_decay,
            beta1=group["betas"][0],
        )

    def _momentum(self, group: dict, params: list, grads: list, outs: list, scales) -> None:
        """MARS-Shampoo: m <- beta1 m + (1 - beta1) c~, Newton-Schulz input m / (1 - beta1)."""
        beta1 = group["betas"][0]
        bufs = self._buffers_of(params, "exp_avg")
        gamma = group_value(group, "gamma", params[0])
        self._corrected_momentum(
            params, grads, bufs, outs, gamma, beta1, scales, out_scale=1.0 / (1.0 - beta1)
        )

    def _ns_setting(self, group: dict) -> tuple[int, float]:
        """The reference's MARS-Shampoo: NS_STEPS iterations normalised with the optimizer's eps."""
        return NS_STEPS, group["eps"]


@dataclass
class MARSConfig(OptimizerConfig):
    """optimizer=mars_adamw (mars_lion and mars_shampoo take the same keys): the GPT-2 small reference
    run's values (docs/algorithms.md section 6)."""

    name: str = "mars_adamw"
    lr: float = 6e-3
    betas: list[float] = field(default_factory=lambda: [0.95, 0.99])
    eps: float = 1e-8
    weight_decay: float = 0.01  # on matrices that are not embeddings (0 on the rest)
    gamma: float = 0.025  # peak gamma; gamma_schedule shapes it over the steps (the trainer drives it)
    gamma_schedule: GammaScheduleConfig = field(default_factory=GammaScheduleConfig)
    approx: bool = True  # false: exact MARS, two gradients per step
    clip_c: bool = True  # the per-tensor unit-norm clip of c_t
    optimize_1d: bool = False  # true: tensors < 2-D take the MARS update too
    lr_1d: float = 3e-3  # tensors < 2-D take AdamW with lr_1d, betas_1d, weight_decay_1d
    betas_1d: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay_1d: float = 0.1
    two_dim_rule: str = "eq2"  # eq2: ndim == 2 takes the matrix rule (reference) | ge2: ndim >= 2
    diagnostics: bool = False  # log mars/* figures (docs/algorithms.md section 8)
    fused: bool | None = None  # None: compiled kernels where available; false: multi-tensor ops
    value_checks = VALUE_CHECKS


@dataclass
class MARSLionConfig(MARSConfig):
    """optimizer=mars_lion: the MARS-AdamW values; the reference tunes only MARS-AdamW."""

    name: str = "mars_lion"


@dataclass
class MARSShampooConfig(MARSConfig):
    """optimizer=mars_shampoo: the MARS-AdamW values; the reference tunes only MARS-AdamW."""

    name: str = "mars_shampoo"


for _name, _config in (
    ("mars_adamw", MARSConfig),
    ("mars_lion", MARSLionConfig),
    ("mars_shampoo", MARSShampooConfig),
):
    register(
        _name,
        _config,
        MARS,
        grouping="decay",
        trainer_keys=("gamma_schedule",),
        fixed={"mars_type": _name.replace("_", "-")},
        mup=NO_SHAMPOO if _name == "mars_shampoo" else ELEMENTWISE,
    )
