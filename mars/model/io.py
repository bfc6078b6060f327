"""Model weights on disk: save_model / load_model, and finding checkpoints in a run directory.

A model directory holds ``model.safetensors`` (the tied wte/lm_head matrix stored once, under
``transformer.wte.weight``) and ``model.json`` (the GPTConfig). The trainer writes one per
checkpoint, ``RUN_DIR/ckpt/step_XXXXXXXX/``, next to ``meta.json``, ``config.yaml`` and
``train_state.pt``; a step directory counts as complete once it holds ``meta.json``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import torch
import torch.nn as nn
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from mars.model.config import GPTConfig
from mars.model.gpt import GPT

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "model.json"
META_FILE = "meta.json"
RUN_CONFIG_FILE = "config.yaml"
CKPT_DIR = "ckpt"
STEP_DIR_RE = re.compile(r"^step_(\d{8})$")
TIED_KEY, EMBEDDING_KEY = "lm_head.weight", "transformer.wte.weight"
WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile, DistributedDataParallel

# model.json must name these; GPTConfig fields added later fall back to their defaults.
REQUIRED_CONFIG_KEYS = (
    "n_layer", "n_head", "n_embd", "block_size", "vocab_size", "bias", "dropout",
    "scale_attn_by_inverse_layer_idx",
)  # fmt: skip

USAGE = "pass a run directory, its ckpt/ directory, or one ckpt/step_XXXXXXXX directory"


class CheckpointError(Exception):
    """A checkpoint file is missing, unreadable, or does not match its model.json."""


class CheckpointNotFoundError(CheckpointError):
    """No (complete) checkpoint at the given path."""


def unwrap_model(model: nn.Module) -> nn.Module:
    """The GPT inside DistributedDataParallel and/or torch.compile wrappers."""
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


def save_model(model: nn.Module, dir: str | os.PathLike) -> Path:
    """Write dir/model.safetensors and dir/model.json; returns the directory."""
    gpt = unwrap_model(model)
    if not isinstance(gpt, GPT):
        raise TypeError(f"save_model expects a mars GPT (possibly compiled / DDP-wrapped), got {type(gpt)}")
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in gpt.state_dict().items() if k != TIED_KEY}
    _write_atomic(out / WEIGHTS_FILE, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
    text = json.dumps(gpt.config.to_dict(), indent=2) + "\n"
    _write_atomic(out / CONFIG_FILE, lambda p: p.write_text(text, encoding="utf-8"))
    return out


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def latest_checkpoint(ckpt_root: str | os.PathLike) -> Path | None:
    """The complete step_XXXXXXXX directory with the highest step under ckpt_root, or None."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return None
    steps = []
    for d in root.iterdir():
        m = STEP_DIR_RE.match(d.name)
        if m and d.is_dir() and (d / META_FILE).is_file():
            steps.append((int(m.group(1)), d))
    return max(steps)[1] if steps else None


def find_checkpoint(path: str | os.PathLike) -> Path:
    """Resolve a run directory, RUN_DIR/ckpt, a step directory or a save_model directory (or its
    model.safetensors file) to the checkpoint directory to load: the latest complete step."""
    p = Path(path)
    if not p.exists():
        raise CheckpointNotFoundError(f"{p} does not exist: {USAGE}")
    if p.is_file():
        if p.name == WEIGHTS_FILE:
            return p.parent
        raise CheckpointError(f"{p} is a file, not a checkpoint: {USAGE}")
    if (p / WEIGHTS_FILE).is_file() or (p / META_FILE).is_file():
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
        if d.is_dir() and ("step_" in d.name)
    )
    hint = (
        f"; ignored incomplete checkpoint(s) {', '.join(incomplete[:3])} (interrupted while saving: "
        f"no {META_FILE})"
        if incomplete
        else ""
    )
    raise CheckpointNotFoundError(
        f"no checkpoint in {p}: looked for {p / WEIGHTS_FILE}, {p / CKPT_DIR}/step_XXXXXXXX/ and "
        f"{p}/step_XXXXXXXX/ holding {META_FILE}{hint}"
    )


def read_model_config(file: Path) -> GPTConfig:
    """GPTConfig from a model.json, with every problem reported against the file."""
    raw = _read_json(file)
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
    return GPTConfig(**raw)


def read_weights(file: Path) -> dict[str, torch.Tensor]:
    """The state_dict in a model.safetensors (on CPU), wrapper prefixes stripped, lm_head re-tied."""
    if not file.is_file():
        raise CheckpointError(f"{file} is missing: the checkpoint has no model weights")
    try:
        tensors = strip_wrapper_prefixes(load_file(str(file), device="cpu"))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{file} is not a readable safetensors file ({e})") from e
    if EMBEDDING_KEY in tensors:
        head = tensors.pop(TIED_KEY, None)
        if head is not None and not torch.equal(head, tensors[EMBEDDING_KEY]):
            raise CheckpointError(f"{file}: {TIED_KEY} differs from {EMBEDDING_KEY}, but GPT ties them")
        tensors[TIED_KEY] = tensors[EMBEDDING_KEY]
    return tensors


def load_weights(model: GPT, ckpt_dir: str | os.PathLike) -> None:
    """Copy ckpt_dir/model.safetensors into an existing model, checking names and shapes."""
    file = Path(ckpt_dir) / WEIGHTS_FILE
    tensors = read_weights(file)
    expected = unwrap_model(model).state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{file} does not match the model in {CONFIG_FILE}: missing tensors {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}, unexpected tensors {unexpected[:5]}"
            f"{' ...' if len(unexpected) > 5 else ''}"
        )
    for key, ref in expected.items():
        if tensors[key].shape != ref.shape:
            raise CheckpointError(
                f"{file}: {key} has shape {tuple(tensors[key].shape)} but {CONFIG_FILE} "
                f"({unwrap_model(model).config}) gives {tuple(ref.shape)}"
            )
    unwrap_model(model).load_state_dict(tensors, strict=True)


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[GPT, dict]:
    """Load the GPT at path (see find_checkpoint), in eval mode, on device.

    info: the contents of meta.json (when present), "config": the run's config.yaml as a dict
    (when present), and "path": the checkpoint directory that was loaded.
    """
    ckpt = find_checkpoint(path)
    config = read_model_config(ckpt / CONFIG_FILE)
    with torch.device("meta"):
        model = GPT(config)
    model.to_empty(device=device)
    model.tie_weights()
    load_weights(model, ckpt)
    model.eval()

    info: dict = {}
    if (ckpt / META_FILE).is_file():
        info.update(_read_json(ckpt / META_FILE))
    if (ckpt / RUN_CONFIG_FILE).is_file():
        info["config"] = _read_yaml(ckpt / RUN_CONFIG_FILE)
    info["path"] = str(ckpt)
    return model, info


def _read_json(file: Path) -> dict:
    if not file.is_file():
        raise CheckpointError(f"{file} is missing")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file} is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} should hold a JSON object, found {type(data).__name__}")
    return data


def _read_yaml(file: Path) -> dict:
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise CheckpointError(f"{file} is not valid YAML ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} should hold a mapping, found {type(data).__name__}")
    return data
