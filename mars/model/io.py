"""Model directories: a GPT as ``model.safetensors`` + ``model.json``, written and read back safely.

``model.safetensors`` holds the state_dict with the tied wte/lm_head matrix stored once (under
``transformer.wte.weight``); ``model.json`` holds the GPTConfig. A training checkpoint holds such a
pair (see mars.checkpoint.layout, which owns the checkpoint layout and finds checkpoints); so does a
directory written by ``save_model`` on its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from mars.checkpoint.layout import MODEL_CONFIG, MODEL_WEIGHTS, CheckpointError, read_json_object
from mars.model.config import ACTIVATIONS, GPTConfig
from mars.model.gpt import GPT

TIED_KEY, EMBEDDING_KEY = "lm_head.weight", "transformer.wte.weight"
WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile, DistributedDataParallel

# model.json must name these; GPTConfig fields added later fall back to the value they stand for in
# files written before them (LEGACY_CONFIG_VALUES), else to their defaults.
REQUIRED_CONFIG_KEYS = (
    "n_layer", "n_head", "n_embd", "block_size", "vocab_size", "bias", "dropout",
    "scale_attn_by_inverse_layer_idx",
)  # fmt: skip
# a model.json without "activation" predates the field, when GPT's MLP used the exact (erf) GELU
LEGACY_CONFIG_VALUES = {"activation": "gelu"}


def unwrap_model(model: nn.Module) -> nn.Module:
    """The GPT inside DistributedDataParallel and/or torch.compile wrappers (FSDP2 wraps in place)."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def strip_wrapper_prefixes(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop leading '_orig_mod.' / 'module.' from keys (state_dicts of compiled or DDP models)."""
    out = {}
    for key, value in state_dict.items():
        while key.startswith(WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


def _gpt(model: nn.Module) -> GPT:
    gpt = unwrap_model(model)
    if not isinstance(gpt, GPT):
        raise TypeError(f"expected a mars GPT (possibly compiled / DDP-wrapped), got {type(gpt)}")
    return gpt


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def save_model_config(model: nn.Module, dir: str | os.PathLike) -> Path:
    """Write dir/model.json (the GPTConfig); returns the directory."""
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_gpt(model).config.to_dict(), indent=2) + "\n"
    _write_atomic(out / MODEL_CONFIG, lambda p: p.write_text(text, encoding="utf-8"))
    return out


def save_model(model: nn.Module, dir: str | os.PathLike) -> Path:
    """Write dir/model.safetensors and dir/model.json; returns the directory. Not for sharded models."""
    gpt = _gpt(model)
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in gpt.state_dict().items() if k != TIED_KEY}
    _write_atomic(out / MODEL_WEIGHTS, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
    return save_model_config(gpt, out)


def read_model_config(file: Path) -> GPTConfig:
    """GPTConfig from a model.json, with every problem reported against the file."""
    raw = read_json_object(file)
    fields = {f.name: f for f in dataclasses.fields(GPTConfig)}
    unknown = sorted(set(raw) - set(fields))
    missing = [k for k in REQUIRED_CONFIG_KEYS if k not in raw]
    if unknown or missing:
        raise CheckpointError(f"{file}: unknown keys {unknown}, missing keys {missing} (GPTConfig fields)")
    for key, value in raw.items():
        expected = type(fields[key].default)
        ok = isinstance(value, (int, float)) if expected is float else isinstance(value, expected)
        if not ok or (expected is not bool and isinstance(value, bool)):
            raise CheckpointError(f"{file}: {key}={value!r} should be a {expected.__name__}")
    if raw.get("activation", "gelu") not in ACTIVATIONS:
        choices = ", ".join(ACTIVATIONS)
        raise CheckpointError(f"{file}: activation={raw['activation']!r} is not one of {choices}")
    return GPTConfig(**{**LEGACY_CONFIG_VALUES, **raw})


def read_weights(file: Path) -> dict[str, torch.Tensor]:
    """The state_dict in a model.safetensors (on CPU), wrapper prefixes stripped, lm_head re-tied.
    Non-finite values are refused: a checkpoint with NaN/inf weights cannot continue a run."""
    if not file.is_file():
        raise CheckpointError(f"{file} is missing: the checkpoint has no model weights")
    try:
        tensors = strip_wrapper_prefixes(load_file(str(file), device="cpu"))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{file} is not a readable safetensors file ({e})") from e
    bad = [k for k, v in tensors.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(
            f"{file}: tensor(s) {', '.join(sorted(bad)[:3])} hold NaN or inf values; this checkpoint is "
            "corrupt or was saved after training diverged: resume from an earlier one"
        )
    if EMBEDDING_KEY in tensors:
        head = tensors.pop(TIED_KEY, None)
        if head is not None and not torch.equal(head, tensors[EMBEDDING_KEY]):
            raise CheckpointError(f"{file}: {TIED_KEY} differs from {EMBEDDING_KEY}, but GPT ties them")
        tensors[TIED_KEY] = tensors[EMBEDDING_KEY]
    return tensors


def check_weights_fit(model: nn.Module, tensors: dict[str, torch.Tensor], file: Path) -> None:
    """Same tensor names and shapes as the model (global shapes for a sharded model)."""
    expected = _gpt(model).state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{file} does not match the model in {MODEL_CONFIG}: missing tensors {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}, unexpected tensors {unexpected[:5]}"
            f"{' ...' if len(unexpected) > 5 else ''}"
        )
    for key, ref in expected.items():
        if tuple(tensors[key].shape) != tuple(ref.shape):
            raise CheckpointError(
                f"{file}: {key} has shape {tuple(tensors[key].shape)} but {MODEL_CONFIG} "
                f"({_gpt(model).config}) gives {tuple(ref.shape)}"
            )


@torch.no_grad()
def load_weights(model: nn.Module, model_dir: str | os.PathLike) -> None:
    """Copy model_dir/model.safetensors into an existing model, checking names and shapes.
    A sharded (FSDP2) model takes each rank's slice of every tensor."""
    file = Path(model_dir) / MODEL_WEIGHTS
    tensors = read_weights(file)
    check_weights_fit(model, tensors, file)
    gpt = _gpt(model)
    for name, param in gpt.state_dict(keep_vars=True).items():
        copy_full_(param, tensors[name])


def copy_full_(dest: torch.Tensor, full: torch.Tensor) -> None:
    """dest <- full, where dest may be a DTensor (then only this rank's shard is copied)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(dest, DTensor):
        piece = distribute_tensor(
            full.to(dest.dtype), dest.device_mesh, dest.placements, src_data_rank=None
        ).to_local()
        dest.to_local().copy_(piece)
    else:
        dest.data.copy_(full)
