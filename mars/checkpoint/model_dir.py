"""Model directories: a model as ``model.safetensors`` + ``model.json``, written and read back safely.

``model.safetensors`` holds the state_dict with a tied matrix stored once (GPT-2's wte/lm_head under
``transformer.wte.weight``; the spec's ``tied`` says which); ``model.json`` holds the model config,
its ``arch`` naming the architecture (a file without one, written before there were two, is GPT-2's).
A training checkpoint holds such a pair (mars.checkpoint.layout names the files); so does a directory
written by ``save_model`` on its own.
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

from mars.checkpoint.layout import AVERAGE_WEIGHTS, MODEL_CONFIG, MODEL_WEIGHTS, read_json_object
from mars.errors import CheckpointError
from mars.files import write_atomic
from mars.model.lm import copy_full_, unwrap_model
from mars.model.spec import DEFAULT_ARCH, ModelSpec, arch, arch_names, check_values, model_config, spec_of

WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile, DistributedDataParallel
AVERAGE_PREFIX = "average."  # the averaged weights' keys in a sharded checkpoint


def strip_wrapper_prefixes(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop leading '_orig_mod.' / 'module.' from keys (state_dicts of compiled or DDP models)."""
    out = {}
    for key, value in state_dict.items():
        while key.startswith(WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


def _model(model: nn.Module) -> nn.Module:
    inner = unwrap_model(model)
    spec_of(inner)  # TypeError for a module of no registered architecture
    return inner


def tied_aliases(model: nn.Module) -> dict[str, str]:
    """{alias: stored name} of the model's tied parameters (lm_head.weight -> the embedding when tied)."""
    inner = _model(model)
    return spec_of(inner).tied(inner.config)


def save_model_config(model: nn.Module, dir: str | os.PathLike) -> Path:
    """Write dir/model.json (the model config, with its arch); returns the directory."""
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(dataclasses.asdict(_model(model).config), indent=2) + "\n"
    write_atomic(out / MODEL_CONFIG, text)
    return out


def save_model(model: nn.Module, dir: str | os.PathLike) -> Path:
    """Write dir/model.safetensors and dir/model.json; returns the directory. Not for sharded models."""
    inner = _model(model)
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    aliases = tied_aliases(inner)
    tensors = {k: v.detach().cpu().contiguous() for k, v in inner.state_dict().items() if k not in aliases}
    write_atomic(out / MODEL_WEIGHTS, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
    return save_model_config(inner, out)


def save_average(average: dict[str, torch.Tensor], dir: str | os.PathLike) -> None:
    """Write dir/average.safetensors: the averaged weights (mars.train.average) by parameter name."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in average.items()}
    write_atomic(Path(dir) / AVERAGE_WEIGHTS, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))


def saved_arch(raw: dict) -> str:
    """The architecture a model.json (or run config's model section) describes: its arch, else gpt2."""
    return str(raw.get("arch", DEFAULT_ARCH))


def read_model_config(file: Path):
    """The model config (of the architecture its arch names) from a model.json, with every problem
    reported against the file."""
    raw = read_json_object(file)
    name = saved_arch(raw)
    if name not in arch_names():  # (a plugin that cannot be imported is its own one line: ConfigError)
        from mars.plugins import ENV, plugin_names

        now = f"{ENV}={','.join(plugin_names())}" if plugin_names() else f"{ENV} is not set"
        raise CheckpointError(
            f"{file}: model.arch={name!r} is not an architecture of this process (it knows "
            f"{', '.join(arch_names())}; {now}): it is a plugin's, so name the module that registers "
            f"{name!r} in {ENV} (e.g. {ENV}=my_arch python ...), or the file comes from a newer mars"
        )
    spec: ModelSpec = arch(name)
    unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(spec.config)})
    missing = [k for k in spec.required_keys if k not in raw]
    if unknown or missing:
        raise CheckpointError(
            f"{file}: unknown keys {unknown}, missing keys {missing} (model.arch={spec.name} config fields)"
        )
    try:
        config = model_config({**spec.legacy_values, **raw}, where=str(file))
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    try:
        check_values(config)
    except ValueError as e:
        raise CheckpointError(f"{file}: {e}") from None
    return config


def read_weights(file: Path, tied: dict[str, str] | None = None) -> dict[str, torch.Tensor]:
    """The state_dict in a model.safetensors (on CPU), wrapper prefixes stripped, the ``tied``
    aliases ({alias: stored name}) put back. Non-finite values are refused: a checkpoint with NaN/inf
    weights cannot continue a run."""
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
    for alias, stored in (tied or {}).items():
        if stored not in tensors:
            continue  # reported by check_weights_fit
        head = tensors.pop(alias, None)
        if head is not None and not torch.equal(head, tensors[stored]):
            raise CheckpointError(f"{file}: {alias} differs from {stored}, but the model ties them")
        tensors[alias] = tensors[stored]
    return tensors


def check_weights_fit(model: nn.Module, tensors: dict[str, torch.Tensor], file: Path) -> None:
    """Same tensor names and shapes as the model (global shapes for a sharded model)."""
    expected = _model(model).state_dict()
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
                f"({_model(model).config}) gives {tuple(ref.shape)}"
            )


@torch.no_grad()
def load_weights(model: nn.Module, model_dir: str | os.PathLike) -> None:
    """Copy model_dir/model.safetensors into an existing model, checking names and shapes.
    A sharded (FSDP2) model takes each rank's slice of every tensor."""
    file = Path(model_dir) / MODEL_WEIGHTS
    tensors = read_weights(file, tied_aliases(model))
    check_weights_fit(model, tensors, file)
    for name, param in _model(model).state_dict(keep_vars=True).items():
        copy_full_(param, tensors[name])
