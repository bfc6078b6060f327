"""Running entry points on the stand-in GPUs (standin_cuda.py), and the calls they record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STANDIN = Path(__file__).with_name("standin_cuda.py")
# a model and run small enough for a few seconds of CPU (the vocabulary stays GPT-2's: the corpus needs it)
TINY = [
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=32",
    "model.block_size=32",
    "train.batch_size=2",
    "train.global_batch_size=4",
    "train.eval_steps=2",
    "train.log_interval=1",
    "train.progress=false",
    "schedule.warmup_steps=0",
    "logger=disabled",
]


def env(devices: int, log: Path) -> dict:
    return dict(
        os.environ,
        WANDB_MODE="disabled",
        OMP_NUM_THREADS="1",
        MARS_OPTIM_FUSED="0",
        MARS_STANDIN_DEVICES=str(devices),
        MARS_STANDIN_LOG=str(log),
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )


def run_standin(
    args: list[str], log: Path, devices: int = 1, ranks: int = 0, cwd: Path = REPO, timeout: float = 240
) -> subprocess.CompletedProcess:
    """An entry point (a script and its arguments, or ["-m", MODULE, ...]) on a machine of `devices`
    stand-in GPUs; with `ranks`, under torchrun with that many processes. Each process's record goes to
    `log` (LOG.RANK under torchrun)."""
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] if ranks else []
    return subprocess.run(
        [sys.executable, *launcher, str(STANDIN), *args],
        cwd=cwd,
        env=env(devices, log),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def calls(log: Path, name: str | None = None) -> list[dict]:
    """The recorded calls (of one name)."""
    recorded = json.loads(log.read_text())
    return [c for c in recorded if name is None or c["call"] == name]
