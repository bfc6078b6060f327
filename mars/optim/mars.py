"""MARS: MARS-AdamW, MARS-Lion and MARS-Shampoo, approximate and exact (docs/algorithms.md 1, 2, 5)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
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
from ._contract import TorchContract
from ._correction import Diagnostics, Work, scales_and_stats
from ._dist import DistributedOptimizer, local
from ._exact import PreviousGradsMixin
from .config import ConfigChecks, GammaScheduleConfig
from .newton_schulz import orthogonalize_
from .registry import reference_names, register

MARS_TYPES = ("mars-adamw", "mars-lion", "mars-shampoo")
TWO_DIM_RULES = ("eq2", "ge2")
NS_STEPS = 5  # the reference's MARS-Shampoo runs five quintic Newton-Schulz iterations

# Group entries a schedule may change: numbers in eager mode, 0-dim tensors inside torch.compile.
SCHEDULED = ("lr", "weight_decay", "gamma", "lr_1d", "weight_decay_1d")

# How a tensor is updated; see MARS._role.
ADAMW_1D, MARS_ADAMW, MARS_LION, MARS_NS = "adamw_1d", "mars_adamw", "mars_lion", "mars_ns"


class MARS(PreviousGradsMixin, DistributedOptimizer, TorchContract, Optimizer):
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

    instance_options = ("is_approx",)
    role_keys = ("mars_type", "optimize_1d", "two_dim_rule")
    correction = staticmethod(rules.correction)  # c_t: override in a subclass for a variant

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
        _checks.flag("MARS", "approx", approx)
        _checks.flag("MARS", "diagnostics", diagnostics)
        _checks.correction("MARS", type(self))
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
        self.is_approx = approx
        self.fused = fused
        self.diagnostics = diagnostics
        self._diagnostics = Diagnostics()
        self.process_group = process_group
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
        """One MARS step on every tensor with a gradient (`step()` calls it).

        1. bucket the tensors (role, device, dtype, step count) and advance their step counts;
        2. the clip factors of every MARS-path tensor from whole-tensor norms (one all-reduce when
           the parameters are sharded), and the diagnostics (mars.optim._correction);
        3. the elementwise updates, on each rank's local shard; MARS-Shampoo's momentum too;
        4. MARS-Shampoo's Newton-Schulz over all its matrices at once (divided over ranks when
           sharded or replicated, mars.optim._dist), then its updates.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_stashed()
        plan = []
        for group in self.param_groups:
            for (role, _, _, count), params in self._buckets(group).items():
                plan.append((group, role, params, advance_steps([self.state[p] for p in params], count)))
        mars_path = [b for b in plan if b[1] != ADAMW_1D]
        work = [
            Work(
                grads=[local(p.grad) for p in params],
                prevs=[local(self.state[p]["last_grad"]) for p in params],
                correction=self.correction,
                gamma=traced(group["gamma"], params[0]),
                beta=group["betas"][0],
                clip=group["clip_c"],
                fused=self.fused,
            )
            for group, _, params, _ in mars_path
        ]
        scales = scales_and_stats(work, self._sharding(), self._diagnostics if self.diagnostics else None)
        clip_scales = {id(b[2]): sc for b, sc in zip(mars_path, scales, strict=True)}
        shampoo = []
        for group, role, params, step in plan:
            if role == MARS_NS:
                shampoo.append(
                    (group, params, self._shampoo_momentum(group, params, clip_scales[id(params)]))
                )
            else:
                self._update(group, role, params, step, clip_scales.get(id(params)))
        if shampoo:
            self._shampoo_updates(shampoo)
        if not self.is_approx:
            self._rotate_previous_grads([p for _, _, params, _ in mars_path for p in params])
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

    def _update(self, group: dict, role: str, params: list, step, scales) -> None:
        """Run one elementwise bucket's rule (mars.optim.rules) on local shards. step: the bucket's step
        count, or (inside torch.compile) the list of its step counters; scales: its clip scales."""
        hp = {key: traced(group[key], params[0]) for key in SCHEDULED}
        states = [self.state[p] for p in params]
        ps = [local(p) for p in params]
        grads = [local(p.grad) for p in params]
        m = [local(s["exp_avg"]) for s in states]
        if role == MARS_LION:
            prevs = [local(s["last_grad"]) for s in states]
            _kernels.update(
                rules.mars_lion,
                [ps, grads, prevs, m],
                [ps, m, prevs],
                fused=self.fused,
                options={"correction": self.correction},
                gamma=hp["gamma"],
                scale=scales,
                lr=hp["lr"],
                weight_decay=hp["weight_decay"],
                beta1=group["betas"][0],
            )
            return
        v = [local(s["exp_avg_sq"]) for s in states]
        vmax = [local(s["max_exp_avg_sq"]) for s in states] if group["amsgrad"] else None
        moments = [m, v] if vmax is None else [m, v, vmax]
        if role == ADAMW_1D:
            adam = adam_hyper(
                lr=hp["lr_1d"],
                weight_decay=hp["weight_decay_1d"],
                betas=group["betas_1d"],
                eps=group["eps"],
                step=step,
                params=ps,
            )
            _kernels.update(rules.adamw, [ps, grads, m, v, vmax], [ps, *moments], fused=self.fused, **adam)
            return
        prevs = [local(s["last_grad"]) for s in states]
        adam = adam_hyper(
            lr=hp["lr"],
            weight_decay=hp["weight_decay"],
            betas=group["betas"],
            eps=group["eps"],
            step=step,
            params=ps,
        )
        _kernels.update(
            rules.mars_adamw,
            [ps, grads, prevs, m, v, vmax],
            [ps, *moments, prevs],
            fused=self.fused,
            options={"correction": self.correction},
            gamma=hp["gamma"],
            scale=scales,
            **adam,
        )

    def _shampoo_momentum(self, group: dict, params: list, scales) -> dict[tuple, list]:
        """MARS-Shampoo's momentum for a bucket of matrices: m <- beta1 m + (1 - beta1) c~; returns, per
        matrix shape, (indices, the bfloat16 batch of Newton-Schulz inputs m / (1 - beta1))."""
        beta1 = group["betas"][0]
        by_shape = defaultdict(list)
        for i, p in enumerate(params):
            by_shape[matrix_shape(p)].append(i)
        batches = {}
        for shape, idx in by_shape.items():
            gs = [as_matrix(local(params[i].grad)) for i in idx]
            prevs = [as_matrix(local(self.state[params[i]]["last_grad"])) for i in idx]
            bufs = [as_matrix(local(self.state[params[i]]["exp_avg"])) for i in idx]
            X = torch.empty((len(idx), *gs[0].shape), dtype=torch.bfloat16, device=gs[0].device)
            _kernels.update(
                rules.mars_momentum,
                [gs, prevs, bufs],
                [bufs, list(X.unbind(0)), prevs],
                fused=self.fused,
                options={"correction": self.correction},
                gamma=traced(group["gamma"], params[0]),
                beta=beta1,
                scale=[scales[i] for i in idx] if isinstance(scales, list) else scales,
                out_scale=1.0 / (1.0 - beta1),
            )
            batches[shape] = (idx, X)
        return batches

    def _shampoo_updates(self, shampoo: list) -> None:
        """Newton-Schulz over every MARS-Shampoo matrix of the step, then x <- x (1 - lr wd) - lr
        sqrt(max(1, rows/cols)) NS(m / (1 - beta1)) on each (local pieces when sharded)."""
        entries = [
            (group, [params[i] for i in idx], shape, X)
            for group, params, batches in shampoo
            for shape, (idx, X) in batches.items()
        ]
        eps = {group["eps"] for group, *_ in entries}
        if len(eps) != 1:  # groups with different eps normalise differently: one Newton-Schulz each
            for group, ps, shape, X in entries:
                self._shampoo_apply(group, ps, shape, self._orthogonalize([X], [shape], _ns(group["eps"]))[0])
            return
        results = self._orthogonalize(
            [X for *_, X in entries], [shape for *_, shape, _ in entries], _ns(eps.pop())
        )
        for (group, ps, shape, _), O in zip(entries, results, strict=True):
            self._shampoo_apply(group, ps, shape, O)

    @staticmethod
    def _shampoo_apply(group: dict, params: list, shape: tuple[int, int], O) -> None:
        rows, cols = shape
        apply_orthogonal_update_(
            [local(p) for p in params],
            O,
            lr=traced(group["lr"], params[0]),
            weight_decay=traced(group["weight_decay"], params[0]),
            scale=max(1.0, rows / cols) ** 0.5,
        )

    def read_diagnostics(self) -> dict[str, float]:
        """The MARS diagnostics since the last call (diagnostics=True; docs/algorithms.md section 8): means
        over the steps of mars/c_norm_mean, mars/clip_fraction, mars/grad_cos, mars/correction_ratio and
        the max of mars/c_norm_max. One read from the device; {} when off or no step was taken."""
        return self._diagnostics.read()


def _ns(eps: float):
    """MARS-Shampoo's Newton-Schulz: the reference form, NS_STEPS iterations, its eps."""

    def ns(batch):
        return orthogonalize_(batch, steps=NS_STEPS, eps=eps, form="reference")

    return ns


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


@dataclass
class MARSConfig(ConfigChecks):
    """optimizer=mars_adamw (mars_lion and mars_shampoo take the same keys). GPT-2 small reference
    (docs/algorithms.md section 6): lr 6e-3, betas (0.95, 0.99), gamma 0.025, wd 0.01 on matrices (0 on
    embeddings); tensors < 2-D take AdamW with lr_1d 3e-3, betas_1d (0.9, 0.95), weight_decay_1d 0.1."""

    name: str = "mars_adamw"
    lr: float = 6e-3
    betas: list[float] = field(default_factory=lambda: [0.95, 0.99])
    eps: float = 1e-8
    weight_decay: float = 0.01
    gamma: float = 0.025  # peak gamma; gamma_schedule shapes it over the steps (the trainer drives it)
    gamma_schedule: GammaScheduleConfig = field(default_factory=GammaScheduleConfig)
    approx: bool = True  # false: exact MARS, two gradients per step
    clip_c: bool = True  # the per-tensor unit-norm clip of c_t
    optimize_1d: bool = False  # true: tensors < 2-D take the MARS update too
    lr_1d: float = 3e-3
    betas_1d: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay_1d: float = 0.1
    two_dim_rule: str = "eq2"  # eq2: ndim == 2 takes the matrix rule (reference) | ge2: ndim >= 2
    diagnostics: bool = False  # log mars/* figures (docs/algorithms.md section 8)
    fused: bool | None = None  # None: compiled kernels where available; false: multi-tensor ops

    def validate(self) -> None:
        self._non_negative("lr", "eps", "weight_decay", "gamma", "lr_1d", "weight_decay_1d")
        self._pair_of_fractions("betas", "betas_1d")
        self._choice("two_dim_rule", TWO_DIM_RULES)
        self.gamma_schedule.validate(self.gamma)


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
    )
