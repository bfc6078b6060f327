"""What MARS and MARS-M share around the correction c_t = correction(g, g_prev, gamma, beta) (the formula:
rules.correction): the static method a variant overrides, where g_prev comes from, the clip of c_t and
the MARS diagnostics (`CorrectionMixin`).

Approximate mode keeps the gradient of the last step as g_prev ("last_grad"). Exact MARS needs
g_prev = grad f(x_{t-1}, xi_t): the new batch's gradient at the previous weights (docs/algorithms.md
section 5). The training loop gets it by looking one batch ahead: at step t, with x_t in place, it
computes grad f(x_t, xi_{t+1}) and calls `stash_previous_grads()`, zeroes the grads, computes
grad f(x_t, xi_t) and calls `step()`. Step t therefore uses the stash made at step t-1 while the
stash made at step t waits for step t+1, so each tensor holds two buffers: "last_grad" (g_prev of
the current step; zeros at the first step) and "previous_grad" (the stash for the next step).
`step()` swaps the two references after updating, with no copy. Inside an outer torch.compile, exact
mode runs eagerly (`stash_previous_grads` and the exact step are excluded from tracing; the graph
breaks there): its protocol state lives in Python attributes that a compiled graph would freeze.
Approximate mode is traced like any optimizer.

The clip c~ = c / max(||c||, 1) needs the norm of each whole tensor before its update. A step first
computes ||c||^2 of every tensor on the MARS path in one pass over g and g_prev
(rules.correction_sq_norm: one compiled reduction over c per large tensor, multi-tensor ops for the
rest), stacks them into one vector and, when the parameters are sharded (FSDP2 DTensors), sums it
over the shards in ONE all-reduce per step; the updates then take each tensor's factor
1 / max(||c||, 1) (rules.clip_scale). The result is the same whether a tensor is whole or split over
ranks. The clip uses ||c||^2 of c itself, so any c_t is clipped the same way.

Diagnostics (diagnostics=True) take one more pass over g and g_prev (rules.correction_stats: ||c||^2,
||g||^2, ||g_prev||^2, ||g - g_prev||^2, ||c - g||^2 per tensor, summed over the shards in the same
all-reduce) and fold the step's figures into an accumulator on the device; nothing is read back until
`Diagnostics.read()` (the trainer calls it at log steps only). The updates do not depend on them.
Reported (means over the steps since the last read; the max for c_norm_max):
  mars/c_norm_mean, mars/c_norm_max  ||c|| over the MARS tensors (before the clip)
  mars/clip_fraction                  fraction of MARS tensors with ||c|| > 1 (clipped when clip_c)
  mars/grad_cos                       cosine between g_t and g_prev over all MARS tensors together
  mars/correction_ratio               ||c - g|| / ||g|| over all MARS tensors together
"""

from __future__ import annotations

import inspect
from collections import defaultdict

import torch
from torch import Tensor

from . import _dist, _kernels, rules
from ._dist import local
from ._step import group_value

DIAGNOSTIC_KEYS = (
    "mars/c_norm_mean",
    "mars/c_norm_max",
    "mars/clip_fraction",
    "mars/grad_cos",
    "mars/correction_ratio",
)
# the columns of rules.correction_stats: ||c||^2, ||g||^2, ||g_prev||^2, ||g - g_prev||^2, ||c - g||^2
C2, G2, P2, D2, CG2 = range(5)


class CorrectionMixin:
    """Before BucketedStep in the bases of MARS and MARSM: `_correction_init` in the constructor; the
    optimizer's `g_prev_roles` take c_t, with `_beta(group)` its beta."""

    correction = staticmethod(rules.correction)  # c_t: override in a subclass for a variant

    def _corrected_momentum(self, params, grads, bufs, outs, gamma, beta, scale, out_scale: float) -> None:
        """The matrices' MARS momentum (MARS-Shampoo, MARS-M): m <- beta m + (1 - beta) c~ (c_t clipped),
        the Newton-Schulz input m * out_scale written to `outs`, g_prev <- g."""
        prevs = self._buffers_of(params, "last_grad")
        _kernels.update(
            rules.mars_momentum,
            [grads, prevs, bufs],
            [bufs, outs, prevs],
            fused=self.fused,
            gate=self._gate,
            options={"correction": self.correction},
            gamma=gamma,
            beta=beta,
            scale=scale,
            out_scale=out_scale,
        )

    def _correction_init(self, approx: bool, diagnostics: bool) -> None:
        if not isinstance(inspect.getattr_static(type(self), "correction", None), staticmethod):
            raise TypeError(
                f"{type(self).__name__}.correction must be a @staticmethod correction(g, g_prev, gamma, "
                f"beta) returning c_t (see {self.owner}'s docstring)"
            )
        self.is_approx = approx
        self.diagnostics = diagnostics
        self._diagnostics = Diagnostics()
        self._stashed = False

    def read_diagnostics(self) -> dict[str, float]:
        """The MARS diagnostics since the last call (diagnostics=True; docs/algorithms.md section 8): means
        over the steps of mars/c_norm_mean, mars/clip_fraction, mars/grad_cos, mars/correction_ratio and
        the max of mars/c_norm_max. One read from the device; {} when off or no step was taken."""
        return self._diagnostics.read()

    def _clip_scales(self, buckets: list) -> dict:
        """{id(bucket params): its clip scales}: the factors 1 / max(||c||, 1), one 0-dim tensor per
        tensor, or 1.0 where clip_c is off; the diagnostics take the step's figures. At most one
        all-reduce over the shards."""
        inputs = [  # per bucket: g and g_prev (local views), c_t's gamma and beta, whether it clips
            (
                [[local(p.grad) for p in params], [local(self.state[p]["last_grad"]) for p in params]],
                dict(gamma=group_value(group, "gamma", params[0]), beta=self._beta(group)),
                group["clip_c"],
            )
            for group, _, params, _ in buckets
        ]

        def tables(rule, of) -> list[Tensor]:
            options = {"correction": self.correction}
            return [_kernels.norms(rule, t, fused=self.fused, options=options, **hyper) for t, hyper, _ in of]

        clipped = [x for x in inputs if x[2]]
        parts = tables(rules.correction_sq_norm, clipped)
        parts += tables(rules.correction_stats, inputs) if self.diagnostics else []
        dtype = torch.float64 if any(t.dtype == torch.float64 for t in parts) else torch.float32
        parts = [t.to(dtype) for t in parts]
        if parts:
            sizes = [t.numel() for t in parts]
            flat = _dist.sum_over_shards_(torch.cat([t.reshape(-1) for t in parts]), self._sharding())
            parts = [f.view(t.shape) for f, t in zip(flat.split(sizes), parts, strict=True)]
        factors = iter(parts[: len(clipped)])
        if self.diagnostics:
            self._diagnostics.add(torch.cat(parts[len(clipped) :]), self._gate)
        scales = [
            list(rules.clip_scale(next(factors)[:, 0]).unbind(0)) if clip else 1.0 for *_, clip in inputs
        ]
        return {id(params): s for (_, _, params, _), s in zip(buckets, scales, strict=True)}

    def _buffer_names(self, p, group) -> set[str]:
        names = super()._buffer_names(p, group)
        if not self.is_approx and self._takes_previous_grad(p, group):
            names.add("previous_grad")
        return names

    def _takes_previous_grad(self, p, group) -> bool:
        return self._role(p, group) in self.g_prev_roles

    # ---- exact mode

    def step(self, closure=None):
        """One step on every tensor with a gradient (tensors whose grad is None are skipped); returns
        the closure's loss when a closure is given."""
        if self.is_approx or not torch.compiler.is_compiling():
            return self._step(closure)
        return torch.compiler.disable(self._step)(closure)

    @property
    def needs_previous_grads(self) -> bool:
        """True in exact mode: the loop must call `stash_previous_grads()` before every `step()`."""
        return not self.is_approx

    def stash_previous_grads(self) -> None:
        """Copy the current p.grad (grad f(x_t, xi_{t+1})) into the optimizer's own buffer; the next
        step() uses it as g_prev. A tensor without a gradient stashes zeros, and so does every tensor
        while `self.found_inf` is set and nonzero (a look-ahead gradient that is not finite is dropped,
        on the device)."""
        if torch.compiler.is_compiling():
            return torch.compiler.disable(self._stash)()
        return self._stash()

    @torch.no_grad()
    def _stash(self) -> None:
        if self.is_approx:
            raise RuntimeError(
                f"{type(self).__name__} is approximate (is_approx=True) and takes g_prev from its own last "
                "step: stash_previous_grads() is for exact mode only. Construct it with is_approx=False, "
                "or drop the extra gradient pass."
            )
        buckets = defaultdict(lambda: ([], []))
        for group in self.param_groups:
            for p in group["params"]:
                if not self._takes_previous_grad(p, group):
                    continue
                state = self.state[p]
                buf = state.get("previous_grad")
                if buf is None:
                    buf = state["previous_grad"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                if p.grad is None:
                    buf.zero_()
                else:
                    bufs, grads = buckets[(p.device, p.dtype)]
                    bufs.append(local(buf))  # a DTensor's shard: the stash stays sharded like p
                    grads.append(local(p.grad))
        gate = self._found_inf_gate()
        for bufs, grads in buckets.values():
            _kernels._store(bufs, grads, gate, otherwise="zero")
        self._stashed = True

    def update_previous_grad(self) -> None:
        """Reference name of `stash_previous_grads()`; like the reference, does nothing when approximate."""
        if not self.is_approx:
            self.stash_previous_grads()

    def update_last_grad(self) -> None:
        """Reference API: its loops call this after step() to move the stash into g_prev. Here step()
        already did that (a reference swap), so there is nothing left to do."""

    def _before_step(self) -> None:
        if not self.is_approx and not self._stashed:
            raise RuntimeError(
                f"{type(self).__name__}(is_approx=False) is exact MARS: before every step() compute the "
                "gradient of the NEXT batch at the current weights and call optimizer.stash_previous_grads() "
                "(see the class docstring), or use is_approx=True."
            )

    def _after_step(self, g_prev: list) -> None:
        """After an exact step: the stash becomes next step's g_prev; the used buffer takes the next stash."""
        if self.is_approx:
            return
        for p in (p for _, _, params, _ in g_prev for p in params):
            state = self.state[p]
            stash = state.get("previous_grad")
            if stash is None:
                state["last_grad"].zero_()
            else:
                state["previous_grad"], state["last_grad"] = state["last_grad"], stash
        self._stashed = False


class Diagnostics:
    """Sums of the per-step MARS diagnostics on the device, read (and reset) at log steps."""

    def __init__(self) -> None:
        self._acc: Tensor | None = None  # [c_norm_mean, c_norm_max, clip_fraction, cos, ratio, steps]

    def add(self, table: Tensor, gate: Tensor | None = None) -> None:
        """Fold one step's table (rules.correction_stats per tensor) into the accumulator, on the device;
        a step whose gate is false (skipped: found_inf) adds nothing."""
        c_norm = table[:, C2].clamp(min=0).sqrt()
        tiny = torch.finfo(table.dtype).tiny
        g_total, p_total = table[:, G2].sum(), table[:, P2].sum()
        cos = (g_total + p_total - table[:, D2].sum()) / 2 / (g_total * p_total).sqrt().clamp(min=tiny)
        ratio = table[:, CG2].sum().clamp(min=0).sqrt() / g_total.sqrt().clamp(min=tiny)
        step = torch.stack(
            [
                c_norm.mean(),
                c_norm.max(),
                (c_norm > 1).to(table.dtype).mean(),
                cos,
                ratio,
                torch.ones_like(cos),
            ]
        )
        if gate is not None:
            step = torch.where(gate.to(step.device), step, torch.zeros_like(step))
        if self._acc is None:
            self._acc = step
        else:
            self._acc = torch.stack(
                [
                    self._acc[0] + step[0],
                    torch.maximum(self._acc[1], step[1]),
                    self._acc[2] + step[2],
                    self._acc[3] + step[3],
                    self._acc[4] + step[4],
                    self._acc[5] + step[5],
                ]
            )

    def read(self) -> dict[str, float]:
        """Means over the steps since the last read (max for c_norm_max); {} when there were none.
        One read from the device."""
        if self._acc is None:
            return {}
        mean_, max_, clipped, cos, ratio, steps = self._acc.tolist()
        self._acc = None
        if steps == 0:  # every step since the last read was skipped
            return {}
        values = (mean_ / steps, max_, clipped / steps, cos / steps, ratio / steps)
        return dict(zip(DIAGNOSTIC_KEYS, values, strict=True))
