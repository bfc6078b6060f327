"""How a run ended, for programs that launch runs: RUN_DIR/outcome.json.

train.py's exit status cannot tell a divergence from a bad data file (both are 1), and under torchrun
or a cluster scheduler the status is the launcher's, not the run's. So when a run ends in the run dir
it owns, rank 0 records how (mars.train.cli), with the time it ended:

    completed    trained to train.max_steps (or found nothing left to train)
    preempted    stopped by SIGTERM / one Ctrl-C after saving a checkpoint (train.resume=auto continues)
    diverged     stopped after train.max_nonfinite_steps non-finite steps in a row; "message" holds the
                 stop line (TrainingDivergedError), "settings" a digest of the run's config
                 (settings_digest): train.resume=auto refuses to continue a diverged run under the
                 same settings (mars.train.rundir), since an exact resume would replay the same steps
                 into the same divergence -- a job script that requeues on any failure would loop

A run that fails for any other reason (a config, data or checkpoint problem, a busy run dir, a crash, a
kill) writes nothing: a launcher that finds no record newer than its launch has a failure to report.
The study driver (mars.study) reads it to rank a diverged trial worst and to stop on any other
failure. Written atomically (mars.files).
"""

from __future__ import annotations

import hashlib
import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mars.errors import UserError
from mars.files import write_atomic

OUTCOME_FILE = "outcome.json"
STATUSES = ("completed", "preempted", "diverged")
NOT_SETTINGS = ("resume", "overwrite")  # train.* keys that say how a run starts, not how it trains


class TrainingDivergedError(UserError):
    """Too many non-finite steps in a row (or a resume that would replay them). `settings`: the
    settings_digest of the run's config."""

    def __init__(self, message: str, settings: str | None = None):
        super().__init__(message)
        self.settings = settings


def settings_digest(cfg: Any) -> str:
    """A digest of everything a run's config sets but how it starts (train.resume, train.overwrite):
    two runs with the same digest train alike from the same checkpoint."""
    from omegaconf import OmegaConf

    values = OmegaConf.to_container(cfg, resolve=True)
    for key in NOT_SETTINGS:
        values.get("train", {}).pop(key, None)
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:16]


def write_outcome(run_dir: Path, status: str, message: str = "", settings: str | None = None) -> None:
    record = {"status": status, "message": message, "time": time.time()}
    if settings is not None:
        record["settings"] = settings
    write_atomic(Path(run_dir) / OUTCOME_FILE, json.dumps(record) + "\n")


def read_outcome(run_dir: Path, since: float | None = None) -> dict | None:
    """The run's outcome record; None when there is none, it cannot be read, or it was written before
    `since` (a time.time(): a record left by an earlier attempt in the same run dir)."""
    try:
        record = json.loads((Path(run_dir) / OUTCOME_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("status") not in STATUSES:
        return None
    written = record.get("time")
    if since is not None and not (isinstance(written, (int, float)) and written >= since):
        return None
    return record


class Outcome:
    """What the block sets: `status`, the Trainer's "completed" or "preempted"."""

    status = "completed"


@contextmanager
def recorded(run_dir: Path | None):
    """Record the block's outcome in run_dir (nothing when run_dir is None: not rank 0)."""
    outcome = Outcome()
    try:
        yield outcome
    except TrainingDivergedError as e:
        if run_dir is not None:
            write_outcome(run_dir, "diverged", str(e), e.settings)
        raise
    if run_dir is not None:
        write_outcome(run_dir, outcome.status)
