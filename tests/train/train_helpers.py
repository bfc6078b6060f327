"""Helpers of the training tests: config composition, tiny-run overrides, subprocess environment."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A model small enough for many CPU runs (the vocabulary stays GPT-2's: the corpus needs it).
TINY_MODEL = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32"]


def tiny_overrides(data_root, **train) -> list[str]:
    """Overrides for a few-second CPU run: tiny model, 4 sequences per step, no wandb, no bar."""
    values = {
        "batch_size": 2,
        "global_batch_size": 4,
        "max_steps": 4,
        "eval_interval": 0,
        "eval_steps": 2,
        "log_interval": 1,
        "ckpt_interval": 0,
        "device": "cpu",
        "progress": False,
    }
    values.update(train)
    return [
        *TINY_MODEL,
        f"data.root={data_root}",
        "logger=disabled",
        f"schedule.warmup_steps={min(2, values['max_steps'])}",  # never longer than the run
        *(f"train.{k}={'null' if v is None else v}" for k, v in values.items()),
    ]


def compose(overrides: list[str] | None = None):
    """The config `python train.py OVERRIDES` would run (Hydra's compose API, no run dir)."""
    from mars.train.cli import compose_config

    return compose_config(overrides)


def subprocess_env() -> dict:
    """Environment of a CLI subprocess: offline, quiet, 1 thread per process (2 cores, 2 ranks)."""
    env = dict(os.environ)
    env.update(
        {
            "WANDB_MODE": "disabled",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
            "HYDRA_FULL_ERROR": "0",
        }
    )
    return env


PYTHON = sys.executable


def run_cli(monkeypatch, capsys, args) -> tuple[int, str, str]:
    """`python train.py ARGS` in this process: (exit status, stdout, stderr)."""
    from mars.train import cli

    monkeypatch.setattr(sys, "argv", ["train.py", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(err: str, *fragments: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    for f in fragments:
        assert f in lines[0], lines[0]


HOLD = """
import sys, time
from mars.train.runlock import hold
with hold(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


@contextmanager
def lock_holder(path: Path):
    """Another live process that holds the run dir's lock (as a run does for its lifetime)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True, env=subprocess_env()
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()
