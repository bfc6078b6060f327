"""The checkpoint layout: the one place that knows where a run's checkpoints live and what they hold.

    RUN_DIR/ckpt/step_00001000/
        meta.json            written last: its presence marks the directory complete
                             {"step", "tokens", "format": "full" | "sharded", "healthy", "world_size",
                              "checksums": "xxh3_128", ...}
        checksums.json       size and checksum of every other file (sharded/ included), written before
                             meta.json; every reader verifies the files it uses (mars.checkpoint.checksums)
        config.yaml          the run's resolved config
        model.json           the model config (its `arch` names the architecture)
        model.safetensors    format "full": the whole model (tied wte/lm_head stored once)
        average.safetensors  format "full", a run with train.average: the averaged weights (float32, by
                             parameter name; mars.train.average)
        sharded/             format "sharded" (FSDP2): torch.distributed.checkpoint files, each rank's
                             shards of the model ("model.FQN"), of the optimizer state ("optim.FQN.BUF")
                             and of the averaged weights ("average.FQN")
        train_state.pt       torch.save of plain data (weights_only-safe): optimizer state (format
                             "full") or its non-tensor part (format "sharded"), loader, RNG, counters
    RUN_DIR/ckpt/.tmp-step_00001000/    a checkpoint being written (renamed when complete)
    RUN_DIR/replaced-YYYYmmdd-HHMMSS/   earlier artifacts moved aside (never deleted) by an overwrite
                                        or a resume from an older checkpoint

Everything that reads or writes checkpoints (the trainer, `python -m eval`, scripts/export_hf.py,
mars.checkpoint.load_model) finds them through this module.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from mars.errors import CheckpointError

CKPT_DIR = "ckpt"
STEP_RE = re.compile(r"^step_(\d{8})$")
TMP_PREFIX = ".tmp-"
META = "meta.json"
CHECKSUMS = "checksums.json"
RUN_CONFIG = "config.yaml"
TRAIN_STATE = "train_state.pt"
MODEL_WEIGHTS = "model.safetensors"
MODEL_CONFIG = "model.json"
AVERAGE_WEIGHTS = "average.safetensors"
SHARDED_DIR = "sharded"
FORMATS = ("full", "sharded")
REPLACED_PREFIX = "replaced-"

USAGE = "pass a run directory, its ckpt/ directory, or one ckpt/step_XXXXXXXX directory"


def step_dirname(step: int) -> str:
    return f"step_{step:08d}"


def step_of(step_dir: str | os.PathLike) -> int:
    m = STEP_RE.match(Path(step_dir).name)
    if not m:
        raise CheckpointError(f"{step_dir} is not a step_XXXXXXXX checkpoint directory")
    return int(m.group(1))


def is_complete(path: Path) -> bool:
    return path.is_dir() and bool(STEP_RE.match(path.name)) and (path / META).is_file()


def list_checkpoints(ckpt_root: str | os.PathLike) -> list[Path]:
    """Complete step directories under ckpt_root, oldest first."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if is_complete(p)), key=lambda p: p.name)


def latest_checkpoint(ckpt_root: str | os.PathLike) -> Path | None:
    found = list_checkpoints(ckpt_root)
    return found[-1] if found else None


def resolve_checkpoint(path: str | os.PathLike) -> Path | None:
    """A run dir, RUN_DIR/ckpt or a step dir -> the (latest) complete step dir; None when there is none."""
    p = Path(path)
    if is_complete(p):
        return p
    if (p / CKPT_DIR).is_dir():
        p = p / CKPT_DIR
    return latest_checkpoint(p)


def find_checkpoint(path: str | os.PathLike) -> Path:
    """Resolve what a user names (a run dir, RUN_DIR/ckpt, a step dir, a model dir written by
    mars.checkpoint.model_dir.save_model, or its model.safetensors) to the directory to load; raise
    with a hint."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{p} does not exist: {USAGE}")
    if p.is_file():
        if p.name == MODEL_WEIGHTS:
            return p.parent
        raise CheckpointError(f"{p} is a file, not a checkpoint: {USAGE}")
    if (p / MODEL_WEIGHTS).is_file() or (p / META).is_file():
        return p
    for root in (p / CKPT_DIR, p):
        latest = latest_checkpoint(root)
        if latest is not None:
            return latest
    incomplete = sorted(
        d.name
        for root in (p / CKPT_DIR, p)
        if root.is_dir()
        for d in root.iterdir()
        if d.is_dir() and "step_" in d.name
    )
    hint = (
        f"; ignored incomplete checkpoint(s) {', '.join(incomplete[:3])} "
        f"(interrupted while saving: no {META})"
        if incomplete
        else ""
    )
    raise CheckpointError(
        f"no checkpoint in {p}: looked for {p / MODEL_WEIGHTS}, {p / CKPT_DIR}/step_XXXXXXXX/ and "
        f"{p}/step_XXXXXXXX/ holding {META}{hint}"
    )


def read_json_object(file: Path) -> dict:
    """A JSON object from `file`, every problem reported as a CheckpointError naming the file."""
    if not file.is_file():
        raise CheckpointError(f"{file} is missing")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file} is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} should hold a JSON object, found {type(data).__name__}")
    return data


def read_meta(step_dir: str | os.PathLike) -> dict:
    """meta.json of a checkpoint, checked for the fields the readers rely on."""
    file = Path(step_dir) / META
    meta = read_json_object(file)
    step = meta.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{file}: 'step' must be a non-negative integer, found {step!r}")
    fmt = meta.get("format", "full")
    if fmt not in FORMATS:
        raise CheckpointError(f"{file}: 'format' must be one of {', '.join(FORMATS)}, found {fmt!r}")
    return meta


def checkpoint_format(step_dir: str | os.PathLike) -> str:
    """'full' (model.safetensors, one writer) or 'sharded' (DCP files written by every rank)."""
    p = Path(step_dir)
    if (p / META).is_file():
        return read_meta(p).get("format", "full")
    return "sharded" if (p / SHARDED_DIR).is_dir() and not (p / MODEL_WEIGHTS).is_file() else "full"


def replaced_dir(run_dir: str | os.PathLike) -> Path:
    """A new RUN_DIR/replaced-YYYYmmdd-HHMMSS[-N] directory for artifacts moved aside."""
    base = Path(run_dir) / f"{REPLACED_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = base, 1
    while path.exists():
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    return path


def move_aside(run_dir: str | os.PathLike, paths: list[Path]) -> Path | None:
    """Move `paths` (inside run_dir) into a fresh replaced-* directory, keeping their relative layout.
    Returns that directory (None when there was nothing to move). Nothing is deleted."""
    run_dir = Path(run_dir)
    existing = [p for p in paths if p.exists()]
    if not existing:
        return None
    dest = replaced_dir(run_dir)
    for p in existing:
        target = dest / p.resolve().relative_to(run_dir.resolve())
        target.parent.mkdir(parents=True, exist_ok=True)
        os.rename(p, target)
    return dest
