"""Learning-rate schedule hook: the one place the trainer touches an optimizer's learning rates."""

from __future__ import annotations

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
