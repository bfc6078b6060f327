"""A trial as train.py sees it: its run dir, its overrides, and what it left behind.

Every trial is an ordinary run of train.py in a run dir of its own under the study dir:

    STUDY_DIR/search/ARM/NNN/              search trials, NNN counting the arm's trials over its rounds
    STUDY_DIR/search/ARM/SIZE/NNN/         with study.tune: the search at each size (mars.study.tuning)
    STUDY_DIR/final/ARM/topK-seedS/        the finals: the arm's K-th best config with train.seed=S

so report.py, plot_curves.py and W&B (group = the study's name) see each like any run. Its overrides
are the spec's base, the arm's overrides, the trial's drawn values and its seed, in that order. The
launcher's stdout and stderr go to RUN_DIR/launch.log.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mars.entry import hydra_value

SEARCH, FINAL = "search", "final"
LAUNCH_LOG = "launch.log"


@dataclass
class Job:
    """One run of train.py for one optuna trial."""

    run_dir: Path
    overrides: list[str]  # training overrides (hydra.run.dir is the launcher's to add)
    resume: bool = False  # rerun an interrupted trial in its own dir with train.resume=auto
    label: str = ""  # e.g. "adamw search 003", for messages
    trial: Any = None  # the optuna trial (the driver's)
    study: Any = None  # its optuna study
    started: float = 0.0  # time.time() when the launcher started it
    overhead_s: float = 0.0  # the driver's own time for this trial: asking, launching, reading, telling
    attempts: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def command_overrides(self) -> list[str]:
        return [*self.overrides, *(["train.resume=auto"] if self.resume else [])]


def search_dir(study_dir: Path, arm: str, index: int, scope: str = "") -> Path:
    """STUDY_DIR/search/ARM/NNN, or STUDY_DIR/search/ARM/SCOPE/NNN for a search at one size of several
    (mars.study.tuning)."""
    arm_dir = Path(study_dir) / SEARCH / arm
    return (arm_dir / scope if scope else arm_dir) / f"{index:03d}"


def final_dir(study_dir: Path, arm: str, rank: int, seed: int) -> Path:
    return Path(study_dir) / FINAL / arm / f"top{rank}-seed{seed}"


def trial_overrides(study, arm, params: dict[str, Any], seed: int, tag: str) -> list[str]:
    """base + the arm's overrides + the drawn values + the seed, then where W&B files it."""
    values = [f"{k}={hydra_value(v)}" for k, v in params.items()]
    return [
        *study.base,
        *arm.overrides,
        *values,
        f"train.seed={seed}",
        f"logger.wandb.group={hydra_value(study.name)}",
        f"logger.wandb.name={hydra_value(f'{study.name}/{tag}')}",
    ]


@dataclass
class Result:
    """What a finished trial reports to the study."""

    status: str  # completed | diverged
    value: float  # the metric's summary; the worst value when diverged
    tokens: float  # training tokens it ran
    train_s: float  # the trainer's own elapsed time
    message: str = ""  # a divergence's stop line


def read_result(run_dir: Path, metric, summary: str, since: float) -> Result | str:
    """The finished trial's result, or why it has none (a failure to report): `since` is when this
    attempt was launched (an older outcome.json is an earlier attempt's)."""
    from mars.analysis.errors import AnalysisError
    from mars.analysis.runs import load_run
    from mars.train.outcome import read_outcome

    outcome = read_outcome(run_dir, since)
    if outcome is None:
        return "it ended without recording an outcome (it failed before or during training, or was killed)"
    if outcome["status"] == "preempted":
        return "preempted"
    try:
        run = load_run(run_dir)
    except AnalysisError as e:  # its metrics.jsonl damaged
        return str(e)
    tokens = run.last_tokens
    seconds = max(
        (p.seconds for pts in run.metrics.values() for p in pts if math.isfinite(p.seconds)), default=0.0
    )
    worst = -math.inf if metric.higher_is_better else math.inf
    if outcome["status"] == "diverged":
        return Result("diverged", worst, tokens, seconds, str(outcome.get("message", "")))
    if metric.key not in run.metrics:
        logged = ", ".join(sorted(run.metrics)) or "nothing"
        return f"it logged no {metric.key} (logged: {logged}); fix study.metric.key"
    values = [p.value for p in run.metrics[metric.key]]
    value = values[-1] if summary == "final" else metric.best(values)
    if not math.isfinite(value):
        return Result("diverged", worst, tokens, seconds, f"its {summary} {metric.key} is {value}")
    return Result("completed", float(value), tokens, seconds)
