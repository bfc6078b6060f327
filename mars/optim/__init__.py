"""mars.optim: the MARS optimizer family and its baselines (see docs/algorithms.md).

    MARS        MARS-AdamW / MARS-Lion / MARS-Shampoo, approximate and exact      (mars.py)
    MARSM       MARS-M on the Moonlight form of Muon, and its one-buffer variant   (mars_m.py)
    Lion        Lion                                                               (lion.py)
    Muon        Muon with AdamW for embeddings, head and 1-D tensors                (muon.py)
    Moonlight   the Moonlight form of Muon                                          (muon.py)
    AdamW       torch.optim.AdamW, registered with its config                       (adamw.py)
    rules       every update rule, written once (c_t, its clip, AdamW, Lion, momenta, the
                orthogonalised step)                                                  (rules.py)
    registry    name -> config dataclass + optimizer; build_optimizer(model, cfg),
                param_groups(model, name): the reference grouping        (registry.py, groups.py)
    config      each optimizer's value checks, once for its constructor and config; the
                reference's keyword names; the gamma schedule                          (config.py)
    set_lr_factor, set_gamma        the trainer's schedule hooks                        (scheduled.py)
    found_inf, skips_on_device      skipping a non-finite step on the device (torch's found_inf)
    keep_lr_1d_ratio                step pre-hook: MARS's lr_1d follows a torch lr_scheduler  (scheduled.py)
    newton_schulz                   batched quintic Newton-Schulz                    (newton_schulz.py)

Each optimizer's module defines its class, its config dataclass (the `optimizer.*` keys it takes,
which are also its constructor's keywords, with their defaults) and registers both; adding an
optimizer is one module. Every optimizer steps through one path (_step.py: one bucketing, one AdamW,
one Newton-Schulz stage for the matrix optimizers and MARS-Shampoo); each update rule is one
function in rules.py, which both the compiled kernels and the multi-tensor path run (_kernels.py).
A variant with another c_t is a subclass of MARS or MARSM that overrides `correction` (see their
docstrings), registered the same way.

Exact mode: `optimizer.needs_previous_grads` is True for MARS/MARSM with approx=False; the loop
then calls `optimizer.stash_previous_grads()` with the next batch's gradient before each step()
(docs/algorithms.md section 5; runnable loop in the MARS docstring).

Every optimizer here keeps torch.optim.Optimizer's contract (_contract.py): named parameters,
state_dict round trips (including torch.load(weights_only=True)) that refuse another optimizer's
state, copy.deepcopy and pickle, step and state-dict hooks, torch.optim.lr_scheduler, and
torch.compile of a whole training step (approximate mode; exact mode runs its step eagerly there).
FSDP2-sharded (DTensor) parameters are updated exactly as whole ones (_dist.py, _correction.py).
"""

import importlib as _importlib
import pkgutil as _pkgutil

from . import adamw, lion, mars, mars_m, muon, rules  # noqa: F401 - each module registers its optimizer(s)
from ._dist import state_bytes
from .adamw import AdamWConfig
from .config import REFERENCE_NAMES, GammaScheduleConfig, OptimizerConfig
from .lion import Lion, LionConfig
from .mars import MARS, MARSConfig, MARSLionConfig, MARSShampooConfig
from .mars_m import MARSM, MARSMConfig
from .muon import Moonlight, MoonlightConfig, Muon, MuonConfig
from .newton_schulz import newton_schulz
from .registry import build_optimizer, make_config, optimizer_names, param_groups, register, registered
from .scheduled import found_inf, keep_lr_1d_ratio, set_gamma, set_lr_factor, skips_on_device

# Every public module of this package is imported, so a new optimizer module registers itself without
# an import line here (adding an optimizer: that module).
for _module in _pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_"):
        _importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "MARS",
    "MARSM",
    "REFERENCE_NAMES",
    "AdamWConfig",
    "GammaScheduleConfig",
    "Lion",
    "LionConfig",
    "MARSConfig",
    "MARSLionConfig",
    "MARSMConfig",
    "MARSShampooConfig",
    "Moonlight",
    "MoonlightConfig",
    "Muon",
    "MuonConfig",
    "OptimizerConfig",
    "build_optimizer",
    "found_inf",
    "keep_lr_1d_ratio",
    "make_config",
    "newton_schulz",
    "optimizer_names",
    "param_groups",
    "register",
    "registered",
    "rules",
    "set_gamma",
    "set_lr_factor",
    "skips_on_device",
    "state_bytes",
]
