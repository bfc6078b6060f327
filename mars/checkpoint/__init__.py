"""mars.checkpoint: the one owner of the checkpoint layout (what a step directory holds, where it lives).

layout.py    names and discovery: RUN_DIR/ckpt/step_XXXXXXXX, meta.json, finding the latest / a given one
files.py     the full-disk error and load-error reasons (durable writing: mars.files)
model_dir.py model.safetensors + model.json: a model written and read back, checked against its architecture
save.py      the atomic save protocol (full and sharded formats) and rotation that keeps the last healthy one
checksums.py checksums.json: every file's size and XXH3-128, written before the marker, verified on load
load.py      verifying a checkpoint before a run relies on it; loading its model in either format
sharded.py   torch.distributed.checkpoint (DCP) files for FSDP2, read without unpickling code
state.py     train_state.pt (weights_only-safe) and RNG capture
export.py    a checkpoint as a Hugging Face model directory
lineage.py   RUN_DIR/lineage.json: the checkpoint a fork or init_from run began from, and where it is now

Submodules load on first attribute access (the layout names come without torch's distributed
checkpoint machinery).
"""

from __future__ import annotations

import importlib

from mars.checkpoint.layout import (
    CKPT_DIR,
    SHARDED_DIR,
    checkpoint_format,
    find_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    move_aside,
    read_meta,
    resolve_checkpoint,
    step_dirname,
    step_of,
)
from mars.errors import CheckpointError

_LAZY = {
    "CheckpointError": "mars.checkpoint.files",
    "export_hf": "mars.checkpoint.export",
    "save_checkpoint": "mars.checkpoint.save",
    "rotate": "mars.checkpoint.save",
    "is_healthy": "mars.checkpoint.save",
    "update_meta": "mars.checkpoint.save",
    "verify_checkpoint": "mars.checkpoint.load",
    "check_model_shape": "mars.checkpoint.load",
    "load_model": "mars.checkpoint.load",
    "load_model_state": "mars.checkpoint.load",
    "read_run_config": "mars.checkpoint.load",
    "model_templates": "mars.checkpoint.load",
    "has_average": "mars.checkpoint.load",
    "load_average": "mars.checkpoint.load",
    "split_optimizer_state": "mars.checkpoint.sharded",
    "optimizer_state_for": "mars.checkpoint.sharded",
    "load_train_state": "mars.checkpoint.state",
    "rng_state": "mars.checkpoint.state",
    "set_rng_state": "mars.checkpoint.state",
}

__all__ = [
    "CKPT_DIR",
    "SHARDED_DIR",
    "CheckpointError",
    "checkpoint_format",
    "find_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "move_aside",
    "read_meta",
    "resolve_checkpoint",
    "step_dirname",
    "step_of",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mars.checkpoint' has no attribute {name!r}")
