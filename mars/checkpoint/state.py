"""The plain-data part of a checkpoint (train_state.pt): RNG capture, and loading it safely.

train_state.pt is read with torch.load(weights_only=True): it can only hold tensors and plain
Python containers, never code. A file that fails that check (truncated, corrupt, or rewritten to
carry other objects) is refused with one line naming it, which never passes on torch's advice to
retry with weights_only=False.
"""

from __future__ import annotations

import os
import pickle
import random
import zipfile
from pathlib import Path

import numpy as np
import torch

from mars.checkpoint.files import load_error_reason
from mars.checkpoint.layout import TRAIN_STATE
from mars.errors import CheckpointError


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


def load_train_state(step_dir: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """train_state.pt of a checkpoint, loaded with weights_only=True; CheckpointError when unusable."""
    path = Path(step_dir) / TRAIN_STATE
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: the checkpoint has no training state")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as e:
        raise CheckpointError(
            f"{path} is not a valid training-state file (truncated, corrupt, or holding objects this harness "
            f"never writes: {load_error_reason(e)}); do not load it any other way: resume from another "
            "checkpoint (train.resume=PATH) or start a new run"
        ) from e
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} should hold a dict, found {type(state).__name__}")
    return state
