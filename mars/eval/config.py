"""The schema of configs/eval.yaml (``python -m eval key=value ...``), registered with Hydra.

As with train.py, a misspelt key fails when Hydra composes the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore

from mars.wandb_mode import WANDB_MODES as WANDB_MODES  # one list: logger.wandb.mode and wandb.mode


@dataclass
class EvalWandbConfig:
    mode: str = "disabled"  # online | offline | disabled
    project: str = "mars"
    name: str | None = None  # None: RUN_NAME@STEP


@dataclass
class EvalConfig:
    ckpt: str | None = None  # run dir, RUN_DIR/ckpt or RUN_DIR/ckpt/step_XXXXXXXX
    tasks: Any = "paper"  # preset (paper | smoke), task/group/tag names, task YAML files or dirs
    include: list[str] = field(default_factory=list)  # extra directories of task YAMLs
    num_fewshot: int = 0
    batch_size: int = 8
    limit: Any = None  # documents per task (a fraction when < 1); None: all
    device: str = "auto"  # auto (cuda when available) | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bfloat16 autocast on CUDA, float32 on CPU) | float32 | bfloat16
    out: str | None = None  # None: RUN_DIR/eval/step_XXXXXXXX (-average with average=true)
    average: bool = False  # the averaged weights a run kept (train.average) instead of its model's
    compare: list[str] = field(default_factory=list)  # more checkpoints or results.json, one row each
    name: str | None = None  # row label of ckpt (default RUN_NAME@STEP)
    force: bool = False  # re-evaluate even when the output dir holds results for the same request
    precache: bool = False  # only download the tasks' datasets into the HF cache, then exit
    wandb: EvalWandbConfig = field(default_factory=EvalWandbConfig)


def register_configs() -> None:
    """Store the schema as `eval_schema` (the first entry of configs/eval.yaml's defaults)."""
    ConfigStore.instance().store(name="eval_schema", node=EvalConfig)
