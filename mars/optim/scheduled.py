"""What the trainer sets on an optimizer every step: the learning-rate factor and MARS's gamma_t (the one
place it touches an optimizer's hyperparameters during a run), and found_inf, the device-side verdict
that a step's gradients are not finite (the step then changes nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.optim import Optimizer

# Learning-rate-like param-group entries. MARS keeps lr_1d at a fixed ratio to lr, as the reference.
LR_KEYS = ("lr", "lr_1d")


def set_lr_factor(optimizer: Optimizer, factor: float) -> None:
    """Set every learning-rate entry of every param group to `factor` times its initial value.

    The initial value of key K is recorded as group["initial_K"] on the first call (the key torch's
    LR schedulers use for "lr"), so it travels in optimizer.state_dict() and a resumed run scales
    from the same base. Works for any torch optimizer; MARS's lr_1d follows lr.
    """
    factor = float(factor)
    for group in optimizer.param_groups:
        for key in LR_KEYS:
            if key in group:
                base = group.setdefault(f"initial_{key}", group[key])
                group[key] = base * factor


def keep_lr_1d_ratio(optimizer: Optimizer, *_hook_args) -> None:
    """Make MARS's lr_1d follow lr when a torch.optim.lr_scheduler drives lr: a step pre-hook.

    torch's schedulers only write group["lr"] (recording group["initial_lr"]); MARS's 1-D AdamW path
    reads group["lr_1d"]. Registered with `optimizer.register_step_pre_hook(keep_lr_1d_ratio)`, this
    sets lr_1d = initial_lr_1d * lr / initial_lr before every step (recording initial_lr_1d on first
    use, the key set_lr_factor uses), so lr_1d / lr keeps its initial value as in the reference.
    Groups without lr_1d or initial_lr are left alone. Hooks belong to the optimizer object: they are
    not copied by copy.deepcopy or pickle nor saved in state_dict(), so register it again on a copy or
    on the optimizer a resumed run builds. Inside torch.compile the hook runs eagerly (a graph break):
    traced, its arithmetic on lr would freeze lr into the graph and recompile it at every step.
    """
    if torch.compiler.is_compiling():
        return torch.compiler.disable(_keep_lr_1d_ratio)(optimizer)
    return _keep_lr_1d_ratio(optimizer)


def _keep_lr_1d_ratio(optimizer: Optimizer) -> None:
    for group in optimizer.param_groups:
        if "lr_1d" in group and group.get("initial_lr"):
            base = group.setdefault("initial_lr_1d", group["lr_1d"])
            group["lr_1d"] = base * group["lr"] / group["initial_lr"]


def set_gamma(optimizer: Optimizer, gamma: float) -> None:
    """Set gamma (the weight of the variance-reduction correction) in every param group that has one
    (MARS, MARS-M), for the next step(). The optimizers read it from the group each step: a Python
    number here, so nothing is recompiled and nothing is read back from the device."""
    gamma = float(gamma)
    for group in optimizer.param_groups:
        if "gamma" in group:
            group["gamma"] = gamma


def skips_on_device(optimizer: Optimizer) -> bool:
    """Whether `optimizer` honours torch's found_inf convention: every optimizer of this package, and
    torch's own fused ones (AdamW(fused=True), ...: those torch.amp.GradScaler hands found_inf to)."""
    ours = getattr(optimizer, "takes_found_inf", False)
    return bool(ours or getattr(optimizer, "_step_supports_amp_scaling", False))


@contextmanager
def found_inf(optimizer: Optimizer, flag: torch.Tensor) -> Iterator[None]:
    """optimizer.found_inf = flag (a 0-dim float tensor on the parameters' device, nonzero: skip) for the
    step() (or exact MARS's stash_previous_grads()) inside the block, as torch.amp.GradScaler sets it:
    the optimizer decides on the device, nothing is read back. Only for an optimizer that
    `skips_on_device`."""
    optimizer.found_inf = flag
    try:
        yield
    finally:
        del optimizer.found_inf
