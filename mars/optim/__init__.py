"""mars.optim: the MARS optimizer family and its baselines (see docs/algorithms.md).

    MARS        MARS-AdamW / MARS-Lion / MARS-Shampoo, approximate and exact      (mars.py)
    MARSM       MARS-M on the Moonlight form of Muon, and its one-buffer variant   (mars_m.py)
    Lion        Lion                                                               (lion.py)
    Muon        Muon with AdamW for embeddings, head and 1-D tensors                (muon.py)
    Moonlight   the Moonlight form of Muon                                          (muon.py)
    param_groups, build_optimizer   reference grouping; build any of them from a config (groups.py)
    set_lr_factor                   the trainer's schedule hook                          (lr.py)
    keep_lr_1d_ratio                step pre-hook: MARS's lr_1d follows a torch lr_scheduler  (lr.py)
    newton_schulz                   batched quintic Newton-Schulz                    (newton_schulz.py)

Exact mode: `optimizer.needs_previous_grads` is True for MARS/MARSM with is_approx=False; the loop
then calls `optimizer.stash_previous_grads()` with the next batch's gradient before each step()
(docs/algorithms.md section 5; runnable loop in the MARS docstring).

Every optimizer here keeps torch.optim.Optimizer's contract (_contract.py): named parameters,
state_dict round trips (including torch.load(weights_only=True)) that refuse another optimizer's
state, copy.deepcopy and pickle, step and state-dict hooks, torch.optim.lr_scheduler, and
torch.compile of a whole training step (approximate mode; exact mode runs its step eagerly there).
"""

from .config import OptimizerConfig
from .groups import OPTIMIZER_NAMES, build_optimizer, param_groups
from .lion import Lion
from .lr import keep_lr_1d_ratio, set_lr_factor
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
    "keep_lr_1d_ratio",
    "newton_schulz",
    "param_groups",
    "set_lr_factor",
]
