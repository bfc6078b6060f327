"""The Weights & Biases modes, one rule for training (logger.wandb.mode) and evaluation (wandb.mode).

Both the trainer (mars.train.metrics) and the evaluation (mars.eval.results) log to wandb; this is
what they share, so neither imports the other for it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

WANDB_MODES = ("online", "offline", "disabled")


def wandb_mode(requested: str) -> str:
    """The mode wandb will run in: WANDB_MODE wins; online without an API key becomes offline."""
    mode = os.environ.get("WANDB_MODE", requested)
    if mode in ("dryrun",):
        mode = "offline"
    if mode == "online" and not os.environ.get("WANDB_API_KEY") and not _netrc_has_wandb():
        log.info("wandb: no WANDB_API_KEY set, logging offline (sync later with `wandb sync`)")
        mode = "offline"
    return mode


def _netrc_has_wandb() -> bool:
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False
