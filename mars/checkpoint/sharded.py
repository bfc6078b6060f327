"""Sharded checkpoint files through torch.distributed.checkpoint (DCP), read without unpickling code.

Under FSDP2 every rank writes only its own shards (no gather of the whole model on one rank) into
STEP_DIR/sharded/, and DCP reshards on load, so a checkpoint written by W ranks loads on any other
number of ranks, or in one process into whole tensors (export, evaluation, a DDP run).

Only tensors go through DCP. DCP stores non-tensor entries with pickle and reads them back with
torch.load(weights_only=False), and it reads its .metadata index with pickle.load; a tampered file
could run code through either. So this project never writes non-tensor entries there (they go to
train_state.pt, loaded weights_only), reads .metadata with an unpickler that only builds DCP's own
metadata classes, and refuses an index that declares a non-tensor entry.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta

from mars.checkpoint.files import load_error_reason
from mars.errors import CheckpointError

_METADATA_FILE = ".metadata"
_DCP_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes, torch dtypes and sizes; refuses every other global."""

    def find_class(self, module: str, name: str):
        if module == _DCP_METADATA_MODULE and not name.startswith("__"):
            return super().find_class(module, name)
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a checkpoint index")


def read_metadata(path: str | os.PathLike) -> Metadata:
    """The DCP index of a sharded checkpoint directory, read safely; CheckpointError when unusable."""
    file = Path(path) / _METADATA_FILE
    try:
        metadata = _MetadataUnpickler(io.BytesIO(file.read_bytes())).load()
    except FileNotFoundError as e:
        raise CheckpointError(f"{file} is missing: the sharded checkpoint is incomplete") from e
    except Exception as e:  # noqa: BLE001 - any decoding failure means a corrupt or foreign index
        raise CheckpointError(f"{file} is not a valid checkpoint index ({type(e).__name__}: {e})") from e
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{file} is not a checkpoint index (found {type(metadata).__name__})")
    foreign = [k for k, v in metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)]
    if foreign:
        raise CheckpointError(
            f"{file} declares non-tensor entries ({', '.join(sorted(foreign)[:3])}), which this harness "
            "never writes and will not unpickle; use a checkpoint written by mars"
        )
    return metadata


class SafeReader(FileSystemReader):
    """FileSystemReader whose index is read by read_metadata() above (tensor data is weights_only)."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        metadata = read_metadata(self.path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def check_files(path: str | os.PathLike) -> Metadata:
    """Every data file the index refers to exists and is long enough; returns the index."""
    path = Path(path)
    metadata = read_metadata(path)
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        rel = str(info.relative_path)
        needed[rel] = max(needed.get(rel, 0), int(info.offset) + int(info.length))
    for rel, size in sorted(needed.items()):
        file = path / rel
        if not file.is_file():
            raise CheckpointError(f"{file} is missing (listed in {path / _METADATA_FILE})")
        if file.stat().st_size < size:
            raise CheckpointError(
                f"{file} is truncated ({file.stat().st_size} bytes, the index needs {size})"
            )
    return metadata


def saved_shapes(path: str | os.PathLike) -> dict[str, torch.Size]:
    """Global shape of every tensor in a sharded checkpoint, by key."""
    return {k: v.size for k, v in read_metadata(path).state_dict_metadata.items()}


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextmanager
def _single_process_quiet():
    """DCP warns that it assumes a single process when torch.distributed is not initialised: that is
    the intent here (export, evaluation, tests), so the warning says nothing."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_tensors(tensors: dict[str, torch.Tensor], path: str | os.PathLike) -> None:
    """Write `tensors` (DTensors: each rank its shards; plain tensors: written once) into `path`.
    Collective: every rank of the default process group calls it with the same keys."""
    bad = [k for k, v in tensors.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise TypeError(f"sharded checkpoints hold tensors only; not tensors: {bad[:3]}")
    writer = FileSystemWriter(str(path), sync_files=True)
    with _single_process_quiet():
        dcp.save(tensors, storage_writer=writer, no_dist=not _distributed())


def load_tensors(templates: dict[str, torch.Tensor], path: str | os.PathLike) -> None:
    """Fill `templates` in place from `path`, resharding as needed: a DTensor gets this rank's shard
    under its own placement, a plain tensor the whole value. Collective under torch.distributed."""
    path = Path(path)
    shapes = saved_shapes(path)
    missing = sorted(set(templates) - set(shapes))
    if missing:
        raise CheckpointError(
            f"{path} lacks {len(missing)} tensor(s) this run needs, e.g. {', '.join(missing[:3])}: it was "
            "written for another model or optimizer"
        )
    wrong = [
        f"{k} {tuple(shapes[k])} (this run: {tuple(t.shape)})"
        for k, t in templates.items()
        if tuple(shapes[k]) != tuple(t.shape)
    ]
    if wrong:
        raise CheckpointError(f"{path} holds tensors of other shapes: {', '.join(wrong[:3])}")
    try:
        with _single_process_quiet():
            dcp.load(templates, storage_reader=SafeReader(str(path)), no_dist=not _distributed())
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - DCP wraps a rank's failure; say what it was, safely
        raise CheckpointError(
            f"{path}: the shard files cannot be read ({load_error_reason(e)}); use another checkpoint"
        ) from e


# ----------------------------------------------------------------------------- optimizer state

OPTIM_PREFIX = "optim."
SHARDED_MARK = "sharded:"  # a train_state.pt entry whose tensor lives in the sharded files


def _flat_params(optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def split_optimizer_state(optimizer, names: dict[int, str]) -> tuple[dict, dict[str, torch.Tensor]]:
    """optimizer.state_dict() with each DTensor replaced by a "sharded:optim.FQN.NAME" placeholder
    (plain data for train_state.pt), and those DTensors by key (for the sharded files).
    `names` maps id(param) to its fully qualified name."""
    from torch.distributed.tensor import DTensor

    sd = optimizer.state_dict()
    params = _flat_params(optimizer)
    tensors: dict[str, torch.Tensor] = {}
    state = {}
    for index, entries in sd["state"].items():
        fqn = names[id(params[index])]
        out = {}
        for name, value in entries.items():
            if isinstance(value, DTensor):
                key = f"{OPTIM_PREFIX}{fqn}.{name}"
                tensors[key] = value
                out[name] = SHARDED_MARK + key
            else:
                out[name] = value
        state[index] = out
    return {**sd, "state": state}, tensors


def optimizer_state_for(optimizer, saved: dict, sharded_dir: Path | None) -> dict:
    """A state_dict that `optimizer` (replicated or FSDP2-sharded, any world size) can load, from a
    checkpoint's saved one: placeholders are filled from `sharded_dir` in this run's layout, and whole
    tensors of a "full" checkpoint are cut to this rank's shard where the parameter is a DTensor."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = _flat_params(optimizer)
    if len(params) != sum(len(g["params"]) for g in saved.get("param_groups", [])):
        return saved  # torch's load_state_dict names the mismatch
    templates: dict[str, torch.Tensor] = {}
    state = {}
    for index, entries in saved.get("state", {}).items():
        param = params[int(index)]
        out = {}
        for name, value in entries.items():
            if isinstance(value, str) and value.startswith(SHARDED_MARK):
                if sharded_dir is None:
                    raise CheckpointError(
                        f"optimizer state {value} refers to sharded files, but there are none"
                    )
                key = value[len(SHARDED_MARK) :]
                templates[key] = out[name] = torch.zeros_like(param)
            elif (
                isinstance(param, DTensor)
                and isinstance(value, torch.Tensor)
                and not isinstance(value, DTensor)
                and tuple(value.shape) == tuple(param.shape)
                and value.ndim > 0
            ):
                out[name] = distribute_tensor(
                    value.to(param.to_local().device), param.device_mesh, param.placements, src_data_rank=None
                )
            else:
                out[name] = value
        state[index] = out
    if templates:
        load_tensors(templates, sharded_dir)
    return {**saved, "state": state}
