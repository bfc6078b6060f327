"""Exact-mode bookkeeping shared by MARS and MARS-M (docs/algorithms.md section 5).

Exact MARS needs g_prev = grad f(x_{t-1}, xi_t): the new batch's gradient at the previous weights.
The training loop gets it by looking one batch ahead: at step t, with x_t in place, it computes
grad f(x_t, xi_{t+1}) and calls `stash_previous_grads()`, zeroes the grads, computes
grad f(x_t, xi_t) and calls `step()`. Step t therefore uses the stash made at step t-1 while the
stash made at step t waits for step t+1, so each tensor holds two buffers: "last_grad" (g_prev of
the current step; zeros at the first step) and "previous_grad" (the stash for the next step).
`step()` swaps the two references after updating, with no copy.

Inside an outer torch.compile, exact mode runs eagerly (`stash_previous_grads` and the exact step are
excluded from tracing; the graph breaks there): its protocol state lives in Python attributes that
a compiled graph would freeze. Approximate mode is traced like any optimizer.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from ._dist import local


class PreviousGradsMixin:
    """Needs `is_approx`, `_stashed`, `_takes_previous_grad(p, group) -> bool` and `_step(closure)`
    (the update) on the optimizer."""

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
        step() uses it as g_prev. A tensor without a gradient stashes zeros."""
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
        for bufs, grads in buckets.values():
            torch._foreach_copy_(bufs, grads)
        self._stashed = True

    def update_previous_grad(self) -> None:
        """Reference name of `stash_previous_grads()`; like the reference, does nothing when approximate."""
        if not self.is_approx:
            self.stash_previous_grads()

    def update_last_grad(self) -> None:
        """Reference API: its loops call this after step() to move the stash into g_prev. Here step()
        already did that (a reference swap), so there is nothing left to do."""

    def _check_stashed(self) -> None:
        if not self.is_approx and not self._stashed:
            raise RuntimeError(
                f"{type(self).__name__}(is_approx=False) is exact MARS: before every step() compute the "
                "gradient of the NEXT batch at the current weights and call optimizer.stash_previous_grads() "
                "(see the class docstring), or use is_approx=True."
            )

    def _rotate_previous_grads(self, params) -> None:
        """After an exact step: the stash becomes next step's g_prev; the used buffer takes the next stash."""
        for p in params:
            state = self.state[p]
            stash = state.get("previous_grad")
            if stash is None:
                state["last_grad"].zero_()
            else:
                state["previous_grad"], state["last_grad"] = state["last_grad"], stash
        self._stashed = False
