"""Synthetic run dirs for the analysis tests: what train.py would leave, with curves we know exactly."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

TOKENS_PER_STEP = 1024
EVAL_EVERY = 10  # steps
MAX_STEPS = 200
DELTA = TOKENS_PER_STEP * EVAL_EVERY  # tokens between evaluations
EVAL_TOKENS = [i * DELTA for i in range(MAX_STEPS // EVAL_EVERY + 1)]  # 0 .. 20 * DELTA

A, B, C = 5.0, 0.3, 2.0  # the baseline's exact power law


def power_law(d: float) -> float:
    """L(D) = 2 + 5 D^-0.3 for D > 0; 10 at initialisation (D = 0, which the fit leaves out)."""
    return C + A * d**-B if d > 0 else 10.0


def shifted(d: float) -> float:
    """A group twice as data-efficient as the baseline: its loss at D is the baseline's at 2D."""
    return power_law(2 * d)


# Abridged from `python train.py --cfg job`: every section the real config.yaml has.
BASE_CONFIG = {
    "model": {"n_layer": 4, "n_head": 4, "n_embd": 256, "block_size": 256, "vocab_size": 50304},
    "data": {
        "name": "embedded",
        "root": "data",
        "dir": None,
        "hf_path": None,
        "hf_config": None,
        "paths": [],
    },
    "optimizer": {
        "name": "mars_adamw",
        "lr": 0.006,
        "weight_decay": 0.01,
        "betas": [0.95, 0.99],
        "gamma": 0.025,
        "approx": True,
        "lr_1d": 0.003,
    },
    "schedule": {"name": "cosine", "warmup_steps": 10, "min_lr": 3e-05},
    "train": {
        "max_steps": MAX_STEPS,
        "batch_size": 4,
        "global_batch_size": 4,
        "eval_interval": EVAL_EVERY,
        "seed": 1337,
        "data_seed": None,
        "device": "auto",
        "progress": True,
        "resume": None,
    },
    "logger": {"wandb": {"mode": "disabled", "project": "mars", "name": None}},
    "downstream": {"tasks": [], "interval": 0},
}

ADAMW = {"name": "adamw", "lr": 0.0006, "weight_decay": 0.1, "betas": [0.9, 0.95], "eps": 1e-08}


def config(**changes) -> dict:
    """BASE_CONFIG with dotted keys changed, e.g. config(**{"optimizer.lr": 3e-3})."""
    cfg = copy.deepcopy(BASE_CONFIG)
    for dotted, value in changes.items():
        node = cfg
        *parents, last = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return cfg


def write_run(
    run_dir: Path,
    cfg: dict,
    overrides: Sequence[str],
    loss: Callable[[float], float] | None,
    offset: float = 0.0,
    tokens: Sequence[float] = EVAL_TOKENS,
    metrics: bool = True,
) -> Path:
    """A run dir: .hydra/{config,overrides}.yaml and metrics.jsonl with train lines every step and
    val lines at `tokens` (val loss = loss(D) + offset; train loss = val loss + 0.05)."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    if not metrics:
        return run_dir
    lines = []
    for d in tokens:
        step = int(d // TOKENS_PER_STEP)
        if loss is not None:
            val = loss(d) + offset
            if step > 0:
                lines.append(
                    {"step": step, "tokens": d, "train/loss": val + 0.05, "lr": 1e-3, "grad_norm": 1.0}
                )
            lines.append({"step": step, "tokens": d, "val/loss": val if math.isfinite(val) else str(val)})
        else:
            lines.append({"step": step, "tokens": d, "train/loss": 5.0, "lr": 1e-3})
    text = "".join(json.dumps(r) + "\n" for r in lines)
    (run_dir / "metrics.jsonl").write_text(text + '{"step": 999, "tok')  # a last line cut by a kill
    return run_dir


BASE_OFFSETS = (-0.01, 0.0, 0.01)  # seeds 1, 2, 3 of the baseline: mean 0
GROUP_OFFSETS = (-0.02, 0.005, 0.015)  # seeds 1, 2, 3 of the other group: mean 0, a larger spread


def two_group_sweep(root: Path, multirun: bool = True) -> Path:
    """One Hydra sweep `-m optimizer=adamw,mars_adamw train.seed=1,2,3`: AdamW on the exact power
    law, MARS-AdamW on the shifted one. The AdamW configs still carry gamma / lr_1d (old run dirs)."""
    root.mkdir(parents=True, exist_ok=True)
    if multirun:
        (root / "multirun.yaml").write_text("hydra: {}\n")
    job = 0
    for name, loss, offsets in (("adamw", power_law, BASE_OFFSETS), ("mars_adamw", shifted, GROUP_OFFSETS)):
        for seed, offset in zip((1, 2, 3), offsets, strict=True):
            opt = {**BASE_CONFIG["optimizer"], **ADAMW} if name == "adamw" else BASE_CONFIG["optimizer"]
            cfg = config(**{"optimizer": opt, "train.seed": seed, "data.root": f"/data/{job}"})
            write_run(root / str(job), cfg, [f"optimizer={name}", f"train.seed={seed}"], loss, offset)
            job += 1
    return root


def write_records(run_dir: Path, cfg: dict, overrides: Sequence[str], records: Sequence[dict]) -> Path:
    """A run dir whose metrics.jsonl holds exactly these records (any keys), one per line."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def seeded_sweep(
    root: Path,
    finals: dict[str, Sequence[float]],
    seeds: dict[str, Sequence[int]] | None = None,
) -> Path:
    """One sweep `-m optimizer.lr=... train.seed=...`: per group (keyed by its lr), one run per seed whose
    val curve is the baseline's power law shifted so that it ends at the given final loss."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    job = 0
    for lr, values in finals.items():
        for i, final in enumerate(values):
            seed = (seeds or {}).get(lr, range(1, len(values) + 1))[i]
            cfg = config(**{"optimizer.lr": float(lr), "train.seed": seed})
            offset = final - power_law(EVAL_TOKENS[-1])
            write_run(root / str(job), cfg, [f"optimizer.lr={lr}", f"train.seed={seed}"], power_law, offset)
            job += 1
    return root
