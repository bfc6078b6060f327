"""mars.optim: the MARS optimizer family and its baselines (see MARS_SPEC.md).

    MARS        MARS-AdamW / MARS-Lion / MARS-Shampoo, approximate and exact      (mars.py)
    MARSM       MARS-M on the Moonlight form of Muon, and its one-buffer variant   (mars_m.py)
    Lion        Lion                                                               (lion.py)
    Muon        Muon with AdamW for embeddings, head and 1-D tensors                (muon.py)
    Moonlight   the Moonlight form of Muon                                          (muon.py)
    param_groups, build_optimizer   reference grouping; build any of them from a config (groups.py)
    set_lr_factor                   the trainer's schedule hook                          (lr.py)
    newton_schulz                   batched quintic Newton-Schulz                    (newton_schulz.py)

Exact mode: `optimizer.needs_previous_grads` is True for MARS/MARSM with is_approx=False; the loop
then calls `optimizer.stash_previous_grads()` with the next batch's gradient before each step()
(MARS_SPEC section 5; runnable loop in the MARS docstring).
"""

from .config import OptimizerConfig
from .groups import OPTIMIZER_NAMES, build_optimizer, param_groups
from .lion import Lion
from .lr import set_lr_factor
from .mars import MARS
from .mars_m import MARSM
from .muon import Moonlight, Muon
from .newton_schulz import newton_schulz

__all__ = [
    "MARS",
    "MARSM",
    "OPTIMIZER_NAMES",
    "Lion",
    "Moonlight",
    "Muon",
    "OptimizerConfig",
    "build_optimizer",
    "newton_schulz",
    "param_groups",
    "set_lr_factor",
]
