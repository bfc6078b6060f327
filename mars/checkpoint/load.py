"""Reading checkpoints: check one before a run relies on it, load its model in either format."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import yaml

from mars.checkpoint import checksums
from mars.checkpoint import sharded as sharded_io
from mars.checkpoint.layout import (
    AVERAGE_WEIGHTS,
    META,
    MODEL_CONFIG,
    MODEL_WEIGHTS,
    RUN_CONFIG,
    SHARDED_DIR,
    checkpoint_format,
    find_checkpoint,
    read_json_object,
    read_meta,
)
from mars.checkpoint.model_dir import (
    AVERAGE_PREFIX,
    load_weights,
    read_model_config,
    read_weights,
    saved_arch,
    tied_aliases,
)
from mars.checkpoint.state import load_train_state
from mars.checks import get
from mars.errors import CheckpointError
from mars.model.lm import copy_full_, unwrap_model
from mars.model.spec import arch_of, spec_for

MODEL_PREFIX = "model."


def read_run_config(step_dir: str | os.PathLike) -> dict:
    """The run's resolved config saved with the checkpoint (config.yaml) as a dict."""
    file = Path(step_dir) / RUN_CONFIG
    if not file.is_file():
        raise CheckpointError(f"{file} is missing: the checkpoint does not record its run's config")
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise CheckpointError(f"{file} is not valid YAML ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} should hold a mapping, found {type(data).__name__}")
    return data


def check_model_shape(step_dir: str | os.PathLike, model_cfg: Any) -> None:
    """CheckpointError when the checkpoint's model.json holds another architecture, or disagrees
    with the config on a key of the architecture's spec.shape_keys."""
    path = Path(step_dir) / MODEL_CONFIG
    saved = read_json_object(path)
    saved = saved.get("config", saved)  # tolerate a {"config": {...}} wrapper
    theirs, ours = saved_arch(saved), arch_of(model_cfg)
    if theirs != ours:
        raise CheckpointError(
            f"checkpoint {step_dir} holds a model.arch={theirs} model, but the config asks for model.arch="
            f"{ours}: resume it with a model={theirs}_* preset, or start a new run dir"
        )
    diffs = [
        f"{k}={saved[k]} (config: {get(model_cfg, k)})"
        for k in spec_for(model_cfg).shape_keys
        if k in saved and saved[k] != get(model_cfg, k)
    ]
    if diffs:
        raise CheckpointError(
            f"checkpoint {step_dir} holds a different model: {', '.join(diffs)}; resume it with the same "
            "model settings, or start a new run dir"
        )


def verify_checkpoint(step_dir: str | os.PathLike) -> dict:
    """Read everything a resume relies on and return meta.json; CheckpointError naming the bad file.

    Checks: every file matches its size and checksum in checksums.json (a checkpoint written before
    checksums existed: noted, not refused); meta.json, model.json and config.yaml parse; the weights
    are readable and finite (format full) or every shard file the index lists is present and long
    enough (format sharded); train_state.pt loads with weights_only=True.
    """
    step_dir = Path(step_dir)
    meta = read_meta(step_dir)
    checksums.verify(step_dir, meta)
    read_model_config(step_dir / MODEL_CONFIG)
    read_run_config(step_dir)
    if meta.get("format", "full") == "sharded":
        sharded_io.check_files(step_dir / SHARDED_DIR)
    else:
        read_weights(step_dir / MODEL_WEIGHTS)
    load_train_state(step_dir)
    return meta


def model_templates(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's tensors keyed as in a sharded checkpoint ("model.FQN"; a tied head stored once)."""
    aliases = tied_aliases(model)
    return {f"{MODEL_PREFIX}{k}": v for k, v in unwrap_model(model).state_dict().items() if k not in aliases}


@torch.no_grad()
def load_model_state(model: torch.nn.Module, step_dir: str | os.PathLike) -> None:
    """Load a checkpoint's weights into `model` (plain or FSDP2-sharded), from either format.
    Collective when the checkpoint is sharded and torch.distributed is initialised."""
    step_dir = Path(step_dir)
    _keep_masked_rows(model, step_dir)
    if checkpoint_format(step_dir) == "full":
        load_weights(model, step_dir)
        return
    templates = model_templates(model)
    sharded_io.load_tensors(templates, step_dir / SHARDED_DIR)
    state = {k[len(MODEL_PREFIX) :]: v for k, v in templates.items()}
    inner = unwrap_model(model)
    for alias, stored in tied_aliases(inner).items():
        state[alias] = state[stored]
    bad = [k for k, v in state.items() if not _finite(v)]
    if bad:
        raise CheckpointError(
            f"{step_dir / SHARDED_DIR}: tensor(s) {', '.join(sorted(bad)[:3])} hold NaN or inf values; "
            "resume from an earlier checkpoint"
        )
    inner.load_state_dict(state, strict=True)


def _keep_masked_rows(model: torch.nn.Module, step_dir: Path) -> None:
    """The checkpoint's vocabulary rows out of the softmax (GPT-2's model.live_vocab_size: a run begun
    from a model with fewer rows masks the padding) stay out, whatever the loading config says: they are
    part of the function the weights compute, as the weights are."""
    inner = unwrap_model(model)
    if hasattr(inner.config, "live_vocab_size"):
        inner.config.live_vocab_size = getattr(
            read_model_config(step_dir / MODEL_CONFIG), "live_vocab_size", None
        )


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t.full_tensor() if hasattr(t, "full_tensor") else t).all())


def _model_file(rel: str) -> bool:
    """The files load_model reads: the model's config and weights (a sharded checkpoint's shard files)."""
    return rel in (MODEL_CONFIG, MODEL_WEIGHTS) or rel.startswith(f"{SHARDED_DIR}/")


def load_model(path: str | os.PathLike, device: str | torch.device = "cpu", average: bool = False):
    """Load the model a run dir / ckpt dir / step dir / model dir names (see find_checkpoint), of the
    architecture its model.json names, in eval mode on `device`, from either format (a sharded
    checkpoint is gathered into this one process). The files it reads are verified against the
    checkpoint's checksums first. average=True: the averaged weights the run kept (train.average) in
    place of its parameters (CheckpointError, one line, for a checkpoint that holds none).

    Returns (model, info): info holds meta.json (when present), "config": the run's config.yaml as a
    dict (when present), and "path": the checkpoint directory that was loaded.
    """
    ckpt = find_checkpoint(path)
    if average and not ((ckpt / META).is_file() and has_average(ckpt)):
        raise CheckpointError(no_average(ckpt))
    if (ckpt / META).is_file():  # a checkpoint (a bare model dir of save_model has no checksums)
        wanted = _model_file if not average else (lambda rel: _model_file(rel) or rel == AVERAGE_WEIGHTS)
        checksums.verify(ckpt, read_meta(ckpt), only=wanted)
    config = read_model_config(ckpt / MODEL_CONFIG)
    model = spec_for(config).model.empty(config, device)
    load_model_state(model, ckpt)
    if average:
        load_average(dict(model.named_parameters()), ckpt)
    model.eval()

    info: dict = {}
    if (ckpt / META).is_file():
        info.update(read_meta(ckpt))
    if (ckpt / RUN_CONFIG).is_file():
        info["config"] = read_run_config(ckpt)
    info["path"] = str(ckpt)
    return model, info


def has_average(step_dir: str | os.PathLike) -> bool:
    """Whether a checkpoint holds averaged weights (its run trained with train.average)."""
    step_dir = Path(step_dir)
    if checkpoint_format(step_dir) == "full":
        return (step_dir / AVERAGE_WEIGHTS).is_file()
    return any(k.startswith(AVERAGE_PREFIX) for k in sharded_io.saved_shapes(step_dir / SHARDED_DIR))


def no_average(step_dir: str | os.PathLike) -> str:
    """Why a checkpoint cannot give averaged weights, for the one line of whoever asked for them."""
    return (
        f"{step_dir} holds no averaged weights: its run trained with train.average=off (or before averaged "
        "weights existed)"
    )


@torch.no_grad()
def load_average(params: dict[str, torch.Tensor], step_dir: str | os.PathLike) -> None:
    """Fill `params` (parameters by name, plain or FSDP2-sharded) with a checkpoint's averaged weights
    (mars.train.average), from either format, resharding as needed. CheckpointError when it holds none,
    none for these names, or non-finite values. Collective when the checkpoint is sharded and
    torch.distributed is initialised."""
    step_dir = Path(step_dir)
    if not has_average(step_dir):
        raise CheckpointError(no_average(step_dir))
    if checkpoint_format(step_dir) == "sharded":
        templates = {f"{AVERAGE_PREFIX}{k}": v.detach() for k, v in params.items()}
        sharded_io.load_tensors(templates, step_dir / SHARDED_DIR)
        bad = [k for k, v in templates.items() if not _finite(v)]
        if bad:
            where = step_dir / SHARDED_DIR
            raise CheckpointError(f"{where}: {', '.join(sorted(bad)[:3])} hold NaN or inf values")
        return
    file = step_dir / AVERAGE_WEIGHTS
    tensors = read_weights(file)
    missing = sorted(set(params) - set(tensors))
    if missing:
        raise CheckpointError(f"{file} lacks {', '.join(missing[:3])}: it was written for another model")
    for name, dest in params.items():
        if tuple(tensors[name].shape) != tuple(dest.shape):
            raise CheckpointError(
                f"{file}: {name} has shape {tuple(tensors[name].shape)}, the model {tuple(dest.shape)}"
            )
        copy_full_(dest, tensors[name])
