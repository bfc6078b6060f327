"""A stand-in for train.py in the study's tests: from a trial's command line (training overrides and
hydra.run.dir=DIR) it writes, in milliseconds, a run dir of the real format (.hydra/config.yaml and
overrides.yaml, metrics.jsonl, outcome.json) whose final val/loss is a known function of the values:

    loss = 5 + 0.1 * log(lr / OPT_LR)^2 + 4 * (gamma - OPT_GAMMA)^2 + noise(train.seed)

A trial diverges (outcome "diverged", exit status 1) when lr > DIVERGE_LR, and fails without an outcome
(exit status 1, an `error:` line) when its run dir's path contains $FAKE_FAIL. $FAKE_SLEEP seconds of
"training" (SIGTERM during them: outcome "preempted", exit 0, as the trainer). $FAKE_LEDGER: a file
that gets one line per run started ("RUN_DIR resume PID" or "RUN_DIR fresh PID"), to count what ran.
The optimum can be moved with $FAKE_OPT_LR and $FAKE_OPT_GAMMA, and made a power law of the model's
width and the run's length (tuning across sizes, mars.study.scale): the optimal lr is
    OPT_LR * (n_embd / 32)^-$FAKE_LR_WIDTH_EXPONENT * (max_steps / 4)^-$FAKE_LR_STEPS_EXPONENT  (0, 0 default)

Budgets and sizes (mars.study.scale): train.max_steps and model.n_embd add a known law,
    + 3 * ((k * max_steps)^-0.5 - 4^-0.5) + 2 * ((n_embd / 32)^-0.5 - 1)
(zero at the smoke spec's 4 steps and width 32), with k = $FAKE_SPEEDUP (default 1) for every optimizer
but adamw: the effective-data speedup of the other arms over adamw is exactly k. train.ckpt_steps writes
a complete checkpoint dir (ckpt/step_N/meta.json) per step; train.fork_from must name one (else exit 1
with an `error:` line, as the trainer), and the fork writes lineage.json.

Time: every line carries train_time = tokens x 1 ms, times $FAKE_SLOWDOWN (default 1) for every optimizer
but adamw, and the first names its hardware (FAKE_HARDWARE). With train.average (not off), val/loss_avg is
val/loss - 0.02 for adamw and + 0.01 for the others (AVERAGE_GAIN).
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import yaml

OPT_LR, OPT_GAMMA, DIVERGE_LR = 3e-3, 0.04, 0.05
TOKENS_PER_EVAL = 1024
FAKE_HARDWARE = "1 process x 1 thread of a fake CPU (2 cores)"
AVERAGE_GAIN = {"adamw": -0.02}  # val/loss_avg - val/loss; +0.01 for any other optimizer


def optimal_lr(width: int = 32, steps: int = 4) -> float:
    """The fake law's optimal lr at a width and a length."""
    a = float(os.environ.get("FAKE_LR_WIDTH_EXPONENT", 0.0))
    b = float(os.environ.get("FAKE_LR_STEPS_EXPONENT", 0.0))
    return float(os.environ.get("FAKE_OPT_LR", OPT_LR)) * (width / 32) ** -a * (steps / 4) ** -b


def objective(lr: float, gamma: float | None, seed: int, scale: float = 0.0, opt_lr: float | None = None):
    opt_lr = optimal_lr() if opt_lr is None else opt_lr
    opt_gamma = float(os.environ.get("FAKE_OPT_GAMMA", OPT_GAMMA))
    loss = 5.0 + 0.1 * math.log(lr / opt_lr) ** 2 + scale
    if gamma is not None:
        loss += 4.0 * (gamma - opt_gamma) ** 2
    return loss + 0.01 * math.sin(7.0 * seed)  # what a seed adds, the same for every setting


def parse(args: list[str]) -> tuple[Path, dict, list[str]]:
    run_dir = Path(yaml.safe_load(next(a.split("=", 1)[1] for a in args if a.startswith("hydra.run.dir="))))
    overrides = [a for a in args if not a.startswith("hydra.")]
    values = {}
    for a in overrides:
        key, _, text = a.partition("=")
        values[key] = yaml.safe_load(text)
    return run_dir, values, overrides


def nested(values: dict) -> dict:
    optimizer = str(values.get("optimizer", "adamw")).split("/")[-1]
    cfg: dict = {
        "model": {
            "arch": "gpt2",
            "n_layer": 1,
            "n_head": 2,
            "n_embd": 32,
            "block_size": 32,
            "vocab_size": 50304,
        },
        "data": {"name": "embedded", "tokenizer": "gpt2"},
        "optimizer": {"name": optimizer, "lr": 1e-3},
        "train": {"max_steps": 4, "global_batch_size": 4, "seed": 1337},
    }
    for key, value in values.items():
        if "." not in key:
            continue
        node = cfg
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    if optimizer == "adamw":
        cfg["optimizer"].pop("gamma", None)
    return cfg


def write_run(args: list[str]) -> int:
    """Do what train.py would; returns the exit status."""
    run_dir, values, overrides = parse(args)
    resume = values.get("train.resume") == "auto"
    if (run_dir / "metrics.jsonl").exists() and not resume:
        print(f"error: run dir {run_dir} already holds a run", file=sys.stderr)
        return 1
    if os.environ.get("FAKE_LEDGER"):
        with open(os.environ["FAKE_LEDGER"], "a") as f:
            f.write(f"{run_dir} {'resume' if resume else 'fresh'} {os.getpid()}\n")
    if os.environ.get("FAKE_FAIL") and os.environ["FAKE_FAIL"] in str(run_dir):
        print("error: data/embedded/train_000000.bin is damaged (fake)", file=sys.stderr)
        return 1
    cfg = nested(values)
    fork = cfg["train"].get("fork_from")
    if fork and not (Path(fork) / "meta.json").is_file():
        print(f"error: train.fork_from={fork}: no complete checkpoint there (fake)", file=sys.stderr)
        return 1
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    if fork:
        lineage = {"kind": "fork", "parent_run_dir": str(Path(fork).parent.parent), "step": int(fork[-8:])}
        (run_dir / "lineage.json").write_text(json.dumps(lineage))
    (run_dir / ".hydra/config.yaml").write_text(yaml.safe_dump(cfg))
    (run_dir / ".hydra/overrides.yaml").write_text(
        yaml.safe_dump([o for o in overrides if o != "train.resume=auto"])
    )
    if _train(float(os.environ.get("FAKE_SLEEP", 0))):
        _outcome(run_dir, "preempted")
        return 0
    lr = float(cfg["optimizer"]["lr"])
    gamma = cfg["optimizer"].get("gamma") if cfg["optimizer"]["name"] != "adamw" else None
    k = 1.0 if cfg["optimizer"]["name"] == "adamw" else float(os.environ.get("FAKE_SPEEDUP", 1.0))
    steps, width = int(cfg["train"]["max_steps"]), int(cfg["model"]["n_embd"])
    scale = 3.0 * ((k * steps) ** -0.5 - 4**-0.5) + 2.0 * ((width / 32) ** -0.5 - 1.0)
    final = objective(lr, gamma, int(cfg["train"]["seed"]), scale, optimal_lr(width, steps))
    for step in cfg["train"].get("ckpt_steps") or []:
        (run_dir / "ckpt" / f"step_{step:08d}").mkdir(parents=True, exist_ok=True)
        (run_dir / "ckpt" / f"step_{step:08d}" / "meta.json").write_text(json.dumps({"healthy": True}))
    name = cfg["optimizer"]["name"]
    slow = 1.0 if name == "adamw" else float(os.environ.get("FAKE_SLOWDOWN", 1.0))
    averaged = str(cfg["train"].get("average", "off")) != "off"
    with open(run_dir / "metrics.jsonl", "w") as f:
        for k in range(5):
            loss = final + 2.0 / (k + 1) - 2.0 / 5 if lr <= DIVERGE_LR or k < 2 else math.nan
            tokens = k * TOKENS_PER_EVAL
            line = {"step": k, "tokens": tokens, "val/loss": str(loss), "time": 0.1 * k}
            if averaged:
                line["val/loss_avg"] = str(loss + AVERAGE_GAIN.get(name, 0.01))
            line["train_time"] = tokens * 1e-3 * slow
            if k == 0:
                line["hardware"] = FAKE_HARDWARE
            f.write(json.dumps(line) + "\n")
    if lr > DIVERGE_LR:
        _outcome(run_dir, "diverged", "stopping at step 3: 5 steps in a row had a non-finite loss (fake)")
        print("error: stopping at step 3 (fake)", file=sys.stderr)
        return 1
    _outcome(run_dir, "completed")
    return 0


def _train(seconds: float) -> bool:
    """Sleep like a training run; True when SIGTERM stopped it (the script only: signals need the main
    thread, and a test's process keeps its own handlers)."""
    if seconds <= 0:
        return False
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
    deadline = time.time() + seconds
    while time.time() < deadline and not stopped:
        time.sleep(0.02)
    return bool(stopped)


def _outcome(run_dir: Path, status: str, message: str = "") -> None:
    (run_dir / "outcome.json").write_text(
        json.dumps({"status": status, "message": message, "time": time.time()})
    )


if __name__ == "__main__":
    sys.exit(write_run(sys.argv[1:]))
