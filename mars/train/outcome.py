"""How a run ended, for programs that launch runs: RUN_DIR/outcome.json.

train.py's exit status cannot tell a divergence from a bad data file (both are 1), and under torchrun
or a cluster scheduler the status is the launcher's, not the run's. So when a run ends in the run dir
it owns, rank 0 records how (mars.train.cli), with the time it ended:

    completed    trained to train.max_steps (or found nothing left to train)
    preempted    stopped by SIGTERM / one Ctrl-C after saving a checkpoint (train.resume=auto continues)
    diverged     stopped after train.max_nonfinite_steps non-finite steps in a row; "message" holds the
                 stop line (TrainingDivergedError)

A run that fails for any other reason (a config, data or checkpoint problem, a busy run dir, a crash, a
kill) writes nothing: a launcher that finds no record newer than its launch has a failure to report.
The study driver (mars.study) reads it to rank a diverged trial worst and to stop on any other
failure. Written atomically (mars.files).
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

from mars.files import write_atomic

OUTCOME_FILE = "outcome.json"
STATUSES = ("completed", "preempted", "diverged")


def write_outcome(run_dir: Path, status: str, message: str = "") -> None:
    record = {"status": status, "message": message, "time": time.time()}
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
    from mars.train.trainer import TrainingDivergedError

    outcome = Outcome()
    try:
        yield outcome
    except TrainingDivergedError as e:
        if run_dir is not None:
            write_outcome(run_dir, "diverged", str(e))
        raise
    if run_dir is not None:
        write_outcome(run_dir, outcome.status)
