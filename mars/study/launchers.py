"""How a trial's train.py runs: n_jobs at a time on this machine, or as jobs of a cluster (submitit).

A launcher starts a Job (mars.study.trials) and hands back a handle; the driver polls the handles and
reads each finished run dir. Both launchers run the same command line, the harness's own entry:

    python -m mars.train OVERRIDES... hydra.run.dir=RUN_DIR          (study.launcher.command replaces
                                                                      `python -m mars.train`)

* local: a subprocess per trial, its stdout and stderr in RUN_DIR/launch.log. With
  study.launcher.gpus_per_job=N each trial gets N GPUs of its own, exactly as a sweep job with
  launch.gpus_per_job=N (mars.train.launch: the same slots, lock files and torchrun command); a trial
  waits for a free set. On Linux a trial gets SIGTERM when its driver dies (even by SIGKILL), so it
  saves a checkpoint and stops, and the driver that resumes the study continues it exactly.
* submitit: each trial a job of a submitit executor (SLURM; `cluster: local` runs them here), with
  study.launcher.submitit as the executor's parameters (timeout_min, slurm_partition, gpus_per_node,
  cpus_per_task, ...); its logs are submitit's (STUDY_DIR/.submitit/).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from mars.study.errors import StudyError
from mars.study.trials import LAUNCH_LOG, Job

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
            from mars.train.config import ConfigError
            from mars.train.launch import gpu_slots, visible_gpus

            try:
                self.slots = gpu_slots(visible_gpus(), self.gpus_per_job)
            except ConfigError as e:
                raise StudyError(
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
            raise StudyError(
                "study.launcher.name=submitit needs submitit: pip install hydra-submitit-launcher"
            ) from None
        params = dict(params)
        cluster = params.pop("cluster", None)
        self.executor = submitit.AutoExecutor(folder=Path(study_dir) / ".submitit", cluster=cluster)
        try:
            self.executor.update_parameters(**params)
        except (TypeError, ValueError) as e:
            raise StudyError(f"study.launcher.submitit: {e}") from None
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
