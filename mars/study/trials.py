"""A trial as train.py sees it: its run dir, its overrides, what it left behind, and the launchers
that run it (local subprocesses, or submitit jobs).

Every trial is an ordinary run of train.py in a run dir of its own under the study dir:

    STUDY_DIR/search/ARM/NNN/              search trials, NNN counting the arm's trials over its rounds
    STUDY_DIR/search/ARM/SIZE/NNN/         with study.tune: the search at each size (mars.study.scale)
    STUDY_DIR/final/ARM/topK-seedS/        the finals: the arm's K-th best config with train.seed=S

so report.py, plot_curves.py and W&B (group = the study's name) see each like any run. Its overrides
are the spec's base, the arm's overrides, the trial's drawn values and its seed, in that order. The
launcher's stdout and stderr go to RUN_DIR/launch.log.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mars.entry import hydra_value
from mars.errors import UserError

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
    (mars.study.scale)."""
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
    from mars.analysis.runs import load_run
    from mars.errors import UserError
    from mars.train.outcome import read_outcome

    outcome = read_outcome(run_dir, since)
    if outcome is None:
        return "it ended without recording an outcome (it failed before or during training, or was killed)"
    if outcome["status"] == "preempted":
        return "preempted"
    try:
        run = load_run(run_dir)
    except UserError as e:  # its metrics.jsonl damaged
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


# --------------------------------------------------------------------------------------------------
# How a trial's train.py runs: n_jobs at a time on this machine, or as jobs of a cluster (submitit).
#
# A launcher starts a Job (mars.study.trials) and hands back a handle; the driver polls the handles and
# reads each finished run dir. Both launchers run the same command line, the harness's own entry:
#
#     python -m mars.train OVERRIDES... hydra.run.dir=RUN_DIR          (study.launcher.command replaces
#                                                                       `python -m mars.train`)
#
# * local: a subprocess per trial, its stdout and stderr in RUN_DIR/launch.log. With
#   study.launcher.gpus_per_job=N each trial gets N GPUs of its own, exactly as a sweep job with
#   launch.gpus_per_job=N (mars.train.launch: the same slots, lock files and torchrun command); a trial
#   waits for a free set. On Linux a trial gets SIGTERM when its driver dies (even by SIGKILL), so it
#   saves a checkpoint and stops, and the driver that resumes the study continues it exactly.
# * submitit: each trial a job of a submitit executor (SLURM; `cluster: local` runs them here), with
#   study.launcher.submitit as the executor's parameters (timeout_min, slurm_partition, gpus_per_node,
#   cpus_per_task, ...); its logs are submitit's (STUDY_DIR/.submitit/).


PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:  # runs in the child before exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the driver died before the line above: no signal will come
        os.kill(os.getpid(), signal.SIGTERM)


def child_env() -> dict[str, str]:
    """The trial's environment: this one, with the package this driver imports first on PYTHONPATH (so
    the trial runs the same code), and W&B's mode as the driver sees it."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_dir_override(run_dir: Path) -> str:
    """hydra.run.dir=RUN_DIR, quoted where Hydra's grammar needs it (a comma, '=', a non-ASCII letter)."""
    from mars.entry import hydra_value

    return f"hydra.run.dir={hydra_value(str(run_dir))}"


def base_command(command: list[str] | None) -> list[str]:
    return list(command) if command else [sys.executable, "-m", "mars.train"]


class LocalHandle:
    def __init__(self, proc: subprocess.Popen, log: Path, stack: ExitStack):
        self.proc, self.log, self._stack = proc, log, stack

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None:
            self._stack.close()  # the log file, the GPU slot
        return code

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self) -> int:
        self.proc.wait()
        return self.poll()


class LocalLauncher:
    """Trials as subprocesses of the driver, `n_jobs` at a time."""

    def __init__(self, study_dir: Path, n_jobs: int, gpus_per_job: int = 0, command: list[str] | None = None):
        self.study_dir, self.gpus_per_job, self.command = Path(study_dir), int(gpus_per_job), command
        self.capacity = int(n_jobs)
        self.slots: list[list[str]] = []
        if self.gpus_per_job > 0:
            from mars.errors import ConfigError
            from mars.train.launch import gpu_slots, visible_gpus

            try:
                self.slots = gpu_slots(visible_gpus(), self.gpus_per_job)
            except ConfigError as e:
                raise UserError(
                    str(e).replace("launch.gpus_per_job", "study.launcher.gpus_per_job")
                ) from None
            self.capacity = min(self.capacity, len(self.slots))

    def command_line(self, job: Job) -> list[str]:
        from mars.train.launch import job_command

        if self.gpus_per_job > 0 and not self.command:
            return job_command(self.gpus_per_job, job.command_overrides, job.run_dir)
        return [*base_command(self.command), *job.command_overrides, run_dir_override(job.run_dir)]

    def start(self, job: Job) -> LocalHandle:
        from mars.train.launch import SLOTS_DIR, claim_slot

        job.run_dir.mkdir(parents=True, exist_ok=True)
        stack = ExitStack()
        env = child_env()
        if self.slots:
            gpus = stack.enter_context(claim_slot(self.study_dir / SLOTS_DIR, self.slots))
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        log = stack.enter_context(open(job.run_dir / LAUNCH_LOG, "a"))
        command = self.command_line(job)
        log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command)}\n")
        log.flush()
        preexec = (
            functools.partial(_die_with_parent, os.getpid()) if sys.platform.startswith("linux") else None
        )
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=preexec)
        return LocalHandle(proc, job.run_dir / LAUNCH_LOG, stack)


class SubmititHandle:
    def __init__(self, job, log: Path):
        self.job, self.log = job, log

    def poll(self) -> int | None:
        if not self.job.done():
            return None
        try:
            self.job.result()
        except Exception:  # noqa: BLE001 - the run dir's outcome.json says what happened
            return 1
        return 0

    def terminate(self) -> None:
        with contextlib.suppress(Exception):
            self.job.cancel(check=False)

    def wait(self) -> int:
        while (code := self.poll()) is None:
            time.sleep(1.0)
        return code


class SubmititLauncher:
    """Trials as submitit jobs (SLURM, or `cluster: local`), `n_jobs` submitted at a time."""

    def __init__(self, study_dir: Path, n_jobs: int, params: dict, command: list[str] | None = None):
        try:
            import submitit
        except ModuleNotFoundError:
            raise UserError(
                "study.launcher.name=submitit needs submitit: pip install hydra-submitit-launcher"
            ) from None
        params = dict(params)
        cluster = params.pop("cluster", None)
        self.executor = submitit.AutoExecutor(folder=Path(study_dir) / ".submitit", cluster=cluster)
        try:
            self.executor.update_parameters(**params)
        except (TypeError, ValueError) as e:
            raise UserError(f"study.launcher.submitit: {e}") from None
        self.capacity, self.command = int(n_jobs), command

    def start(self, job: Job) -> SubmititHandle:
        from submitit.helpers import CommandFunction

        job.run_dir.mkdir(parents=True, exist_ok=True)
        command = [*base_command(self.command), *job.command_overrides, run_dir_override(job.run_dir)]
        submitted = self.executor.submit(CommandFunction(command, cwd=os.getcwd(), env=child_env()))
        return SubmititHandle(submitted, Path(submitted.paths.stderr))


def make_launcher(study):
    spec = study.spec["launcher"]
    if spec["name"] == "submitit":
        return SubmititLauncher(study.dir, spec["n_jobs"], spec["submitit"], spec["command"])
    return LocalLauncher(study.dir, spec["n_jobs"], spec["gpus_per_job"], spec["command"])
