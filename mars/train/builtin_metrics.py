"""mars's own metrics of (model, optimizer), registered like a researcher's (mars.train.metrics).

    gamma     the correction weight the step of the line used (group 0's): the MARS family, whose
              gamma the trainer drives with optimizer.gamma_schedule
    mars/KEY  the MARS diagnostics since the last line (optimizer.diagnostics=true; docs/algorithms.md
              section 8), read from the device once per line, on rank 0 only (the written rank)

Each returns an empty dict (nothing logged) where it does not apply. What stays in the trainer's own
record, and why: mars.train.metrics.TRAINER_KEYS.
"""

from __future__ import annotations

from typing import Any

import torch

from mars.train.metrics import register_builtin_metric


def gamma(model: Any, optimizer: Any) -> float | dict:
    group = optimizer.param_groups[0]
    return float(group["gamma"]) if "gamma" in group else {}


def mars_diagnostics(model: Any, optimizer: Any) -> dict[str, float]:
    if not getattr(optimizer, "diagnostics", False):
        return {}
    if (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_rank()
    ):
        return {}  # only rank 0's line is written: the other ranks keep their sums unread
    return {key.removeprefix("mars/"): value for key, value in optimizer.read_diagnostics().items()}


register_builtin_metric("gamma", gamma)
register_builtin_metric("mars", mars_diagnostics)
