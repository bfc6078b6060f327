"""Checkpoints: atomic step directories under RUN_DIR/ckpt, rotation, safe loading, RNG capture.

Layout (shared with mars.model.io, which reads it):

    RUN_DIR/ckpt/step_00001000/
        model.safetensors, model.json   mars.model.io.save_model
        train_state.pt                  optimizer, schedule position, loader, RNG states (weights_only-safe)
        meta.json                       {"step", "tokens", "wandb_run_id", ...}
        config.yaml                     the resolved config

A step directory is written as ckpt/.tmp-step_XXXXXXXX and renamed when complete, so a
directory named step_\\d{8} holding meta.json is always whole, even after a SIGKILL.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

CKPT_DIRNAME = "ckpt"
STEP_RE = re.compile(r"^step_(\d{8})$")
TMP_PREFIX = ".tmp-"
# GPTConfig fields that fix the parameter shapes: a checkpoint only loads into the same values
SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "bias")


class CheckpointMismatchError(ValueError):
    """A checkpoint that cannot continue this config (different model shape)."""


def step_dirname(step: int) -> str:
    return f"step_{step:08d}"


def list_checkpoints(ckpt_root: str | os.PathLike) -> list[Path]:
    """Complete step directories, oldest first."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    found = [
        p for p in root.iterdir() if p.is_dir() and STEP_RE.match(p.name) and (p / "meta.json").is_file()
    ]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(ckpt_root: str | os.PathLike) -> Path | None:
    found = list_checkpoints(ckpt_root)
    return found[-1] if found else None


def resolve_checkpoint(path: str | os.PathLike) -> Path | None:
    """A run dir, RUN_DIR/ckpt or a step dir -> the (latest) complete step dir, None when there is none."""
    p = Path(path)
    if STEP_RE.match(p.name) and (p / "meta.json").is_file():
        return p
    if (p / CKPT_DIRNAME).is_dir():
        p = p / CKPT_DIRNAME
    return latest_checkpoint(p)


def read_meta(step_dir: str | os.PathLike) -> dict:
    return json.loads((Path(step_dir) / "meta.json").read_text())


def check_model_shape(step_dir: str | os.PathLike, model_cfg: Any) -> None:
    """Raise CheckpointMismatchError when the checkpoint's model.json disagrees with the config's shape."""
    path = Path(step_dir) / "model.json"
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointMismatchError(f"cannot read {path}: {e}") from e
    saved = saved.get("config", saved)  # tolerate a {"config": {...}} wrapper
    diffs = [
        f"{k}={saved[k]} (config: {getattr(model_cfg, k)})"
        for k in SHAPE_KEYS
        if k in saved and saved[k] != getattr(model_cfg, k)
    ]
    if diffs:
        raise CheckpointMismatchError(
            f"checkpoint {step_dir} holds a different model: {', '.join(diffs)}; resume it with the same "
            "model settings, or start a new run dir"
        )


def rng_state() -> dict:
    """Python, numpy, torch (and CUDA) RNG states in a form torch.load(weights_only=True) accepts."""
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np.asarray(np_state["state"]["key"], dtype=np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    npst = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": npst["bit_generator"],
            "state": {"key": npst["key"].numpy().astype(np.uint32), "pos": npst["pos"]},
            "has_gauss": npst["has_gauss"],
            "gauss": npst["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)


def all_finite(module: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in module.parameters())


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    model: torch.nn.Module,
    train_state: dict,
    meta: dict,
    config_yaml: str,
    keep_last: int,
) -> Path:
    """Write RUN_DIR/ckpt/step_XXXXXXXX atomically, then delete all but the newest `keep_last`.

    `model` is the bare model (no DDP / torch.compile wrapper), so parameter names carry no
    'module.' or '_orig_mod.' prefix. Refuses to write non-finite weights.
    """
    from mars.model.io import save_model

    if not all_finite(model):
        raise FloatingPointError(f"refusing to checkpoint non-finite weights at step {step}")
    root = Path(run_dir) / CKPT_DIRNAME
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dirname(step)
    tmp = root / f"{TMP_PREFIX}{final.name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_model(model, tmp)
    torch.save(train_state, tmp / "train_state.pt")
    (tmp / "config.yaml").write_text(config_yaml)
    # meta.json last: its presence marks the directory complete
    _write_synced(tmp / "meta.json", json.dumps({**meta, "step": step}, indent=2) + "\n")
    if final.exists():  # re-saving a step (e.g. after a resume): swap out the old copy
        old = root / f"{TMP_PREFIX}old-{final.name}"
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    _fsync_dir(root)
    rotate(root, keep_last)
    return final


def rotate(ckpt_root: str | os.PathLike, keep_last: int) -> None:
    """Delete complete checkpoints beyond the newest `keep_last`, and leftovers of interrupted saves."""
    root = Path(ckpt_root)
    for old in list_checkpoints(root)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for leftover in root.glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(leftover, ignore_errors=True)


def load_train_state(step_dir: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    path = Path(step_dir) / "train_state.pt"
    return torch.load(path, map_location=map_location, weights_only=True)


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
