"""SLURM's launcher on this machine: hydra-submitit-launcher's local executor (hydra/launcher=submitit_local)
runs each job of a sweep as a submitit job, as submitit_slurm does on a cluster. Marked slow.

Before it ends a job (the time limit, a preemption) submitit has SLURM send SIGUSR2; its handler then
requeues the job with the same arguments. Here a plugin (MARS_PLUGINS) sends SIGUSR2 to the first job
that reaches its second log step, as `submitit`'s own test hook `job._interrupt()` does.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from train_helpers import PYTHON, REPO, subprocess_env, tiny_overrides

from mars.checkpoint import latest_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.extended]  # make test-all

PREEMPT_ONCE = """
import os, signal
from mars.train.metrics import register_metric

_calls = 0


def _preempt_once(model, optimizer):  # once before step 1 (the trainer's check), then at every log step
    global _calls
    _calls += 1
    if _calls == 1 + 2:  # at the log of step 2
        try:  # the first job here takes the marker; the other job runs straight
            os.close(os.open(os.environ["PREEMPT_MARKER"], os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return 0.0
        os.kill(os.getpid(), signal.SIGUSR2)
    return 0.0


register_metric("fault/preempt_once", _preempt_once)
"""


def test_submitit_local_sweep_and_its_requeue_on_sigusr2(data_root, tmp_path):
    """Two jobs alike but for a label (logger.wandb.name, unused with logger=disabled), each in its own run
    dir. The preempted job finishes its step, saves a checkpoint and hands SIGUSR2 to submitit, which
    requeues it; train.resume=auto continues it from that checkpoint, to the same losses as the other."""
    sweep = tmp_path / "sweep"
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "preempt_once.py").write_text(PREEMPT_ONCE)
    env = subprocess_env()
    env.update(
        MARS_PLUGINS="preempt_once",
        PREEMPT_MARKER=str(tmp_path / "preempted"),
        PYTHONPATH=f"{tmp_path / 'plugins'}{os.pathsep}{env['PYTHONPATH']}",
    )
    overrides = tiny_overrides(data_root, ckpt_interval=0, eval_steps=2)  # checkpoints: the final one only
    proc = subprocess.run(
        [PYTHON, str(REPO / "train.py"), "-m", "hydra/launcher=submitit_local", "logger.wandb.name=a,b",
         *overrides, "train.resume=auto", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = [sweep / "0", sweep / "1"]
    for job in jobs:
        assert (job / ".hydra" / "config.yaml").is_file() and (job / "train.log").is_file()
        assert latest_checkpoint(job / "ckpt").name == "step_00000004"
    logs = {job: (job / "train.log").read_text() for job in jobs}
    preempted = [job for job in jobs if "stopped by SIGUSR2" in logs[job]]
    assert len(preempted) == 1, logs
    (job,) = preempted
    straight = next(j for j in jobs if j != job)
    # the trainer saved at the signal (train.ckpt_interval=0 saves no other checkpoint before the end) ...
    assert "stopped by SIGUSR2 at step 3, checkpoint saved; continue with: python train.py " in logs[job]
    assert f"train.resume=auto hydra.run.dir={job}" in logs[job]
    # ... then submitit requeued the job, and the requeued job continued from that checkpoint
    submitit_logs = sorted((sweep / ".submitit").glob("*/*_log.out"))
    assert len(submitit_logs) == 2 and sum("Requeued job" in p.read_text() for p in submitit_logs) == 1
    assert f"train.resume=auto: continuing from {job}/ckpt/step_00000003 (step 3)" in logs[job]
    lines = {j: [json.loads(s) for s in (j / "metrics.jsonl").read_text().splitlines()] for j in jobs}
    assert [r["step"] for r in lines[job] if "train/loss" in r] == [1, 2, 3, 4]
    for key in ("train/loss", "grad_norm", "val/loss"):
        got = [(r["step"], r[key]) for r in lines[job] if key in r]
        assert got == [(r["step"], r[key]) for r in lines[straight] if key in r], key
