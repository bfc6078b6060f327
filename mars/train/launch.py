"""Sweep jobs that run on GPUs of their own (launch.gpus_per_job), on one machine.

hydra/launcher=parallel (hydra-joblib-launcher) runs `hydra.launcher.n_jobs` jobs of a sweep at a
time, each in a worker process. A worker cannot move a CUDA context between devices, and a job of N
GPUs needs N processes, so a job with launch.gpus_per_job=N >= 1 is run as a subprocess of its
worker: `python -m mars.train` (N = 1) or `torchrun --nproc_per_node=N -m mars.train` (N > 1), with
CUDA_VISIBLE_DEVICES set to a set of N GPUs that no other job of the sweep holds. The sets are
claimed through lock files in SWEEP_DIR/.gpu_slots (fcntl locks die with their process, so a killed
job never keeps its GPUs); a job waits until a set is free. The subprocess writes into the job's
own run dir, with the job's own overrides.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from mars.errors import ConfigError

log = logging.getLogger("mars.train")
SLOTS_DIR = ".gpu_slots"


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_slots(gpus: list[str], per_job: int) -> list[list[str]]:
    """Disjoint sets of `per_job` GPUs (a remainder that cannot form a set stays unused)."""
    if per_job < 1:
        raise ValueError(f"per_job={per_job} must be >= 1")
    if len(gpus) < per_job:
        raise ConfigError(
            f"launch.gpus_per_job={per_job} but this machine shows {len(gpus)} GPU(s) "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); lower it"
        )
    return [gpus[i : i + per_job] for i in range(0, len(gpus) - per_job + 1, per_job)]


@contextmanager
def claim_slot(lock_dir: Path, slots: list[list[str]], poll_s: float = 2.0, timeout_s: float | None = None):
    """Hold one free slot (its GPU list) for the duration of the block; waits while all are taken."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    while True:
        for i, gpus in enumerate(slots):
            f = open(lock_dir / f"slot{i}.lock", "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                continue
            try:
                f.write(f"{os.getpid()} {','.join(gpus)}\n")
                f.flush()
                yield gpus
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
                f.close()
            return
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise TimeoutError(f"no free GPU slot in {lock_dir} after {timeout_s} s")
        time.sleep(poll_s)


def job_command(per_job: int, overrides: list[str], run_dir: Path) -> list[str]:
    """The command that runs one sweep job as a plain run in its own run dir."""
    from mars.entry import hydra_value

    args = [*overrides, f"hydra.run.dir={hydra_value(str(run_dir))}", "launch.gpus_per_job=0"]
    if per_job == 1:
        return [sys.executable, "-m", "mars.train", *args]
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={per_job}",
        "-m", "mars.train", *args,
    ]  # fmt: skip


def preemption_signals() -> list[signal.Signals]:
    """The signal a cluster launcher sends before it ends a job, besides SIGTERM: under submitit
    (hydra/launcher=submitit_slurm or submitit_local) SIGUSR2 (or $SUBMITIT_PREEMPT_SIGNAL), which it
    asks SLURM to send `signal_delay_s` seconds before the time limit, and on which its own handler
    requeues the job. The trainer stops on it as on SIGTERM (the step finishes, a checkpoint is saved),
    then `pass_on` hands it to that handler."""
    if "SUBMITIT_EXECUTOR" not in os.environ:
        return []
    sig = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
    return [sig] if isinstance(sig, signal.Signals) else []


def pass_on(signum: int | None) -> None:
    """After a run stopped (and saved) on a cluster launcher's signal: call the handler the launcher
    installed for it (submitit: requeue the job with the same arguments, and exit on rank 0)."""
    if signum not in preemption_signals():
        return
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, None)


def wants_own_gpus(cfg) -> bool:
    """True in a sweep job (-m) with launch.gpus_per_job >= 1 that is not itself a launched rank."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from mars.train.distributed import launched_distributed

    if cfg.launch.gpus_per_job < 1 or launched_distributed():
        return False
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def run_on_own_gpus(cfg) -> None:
    """Run this sweep job as a subprocess on a GPU set of its own; raise when it fails."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    per_job = int(cfg.launch.gpus_per_job)
    slots = gpu_slots(visible_gpus(), per_job)
    run_dir = Path(hc.runtime.output_dir)
    overrides = [o for o in hc.overrides.task if not o.startswith("launch.gpus_per_job=")]
    with claim_slot(Path(hc.sweep.dir) / SLOTS_DIR, slots) as gpus:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(gpus)}
        log.info(f"job {hc.job.num}: GPUs {','.join(gpus)} -> {run_dir}")
        returncode = run_job(job_command(per_job, overrides, run_dir), env)
    if returncode != 0:
        raise RuntimeError(
            f"sweep job {hc.job.num} ({' '.join(overrides)}) failed with exit status {returncode}; "
            f"see {run_dir}"
        )


def run_job(command: list[str], env: dict) -> int:
    """Run a job's command to its end; its exit status. A Ctrl-C reaches the job too (one process group):
    the job finishes its step and saves (torchrun passes the signal on to its ranks and waits for them),
    so it is waited for before the interrupt goes on. (subprocess.run would kill it after 0.25 s,
    mid-save; and a torchrun's ranks die with it.)"""
    proc = subprocess.Popen(command, env=env)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.wait()  # a second Ctrl-C stops the job at once, and this wait with it
        raise
