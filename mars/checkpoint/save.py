"""Writing checkpoints atomically and durably, and rotating old ones without losing the last healthy one.

Protocol of one save (STEP_DIR = RUN_DIR/ckpt/step_XXXXXXXX):
  1. write everything into ckpt/.tmp-step_XXXXXXXX (format "sharded": every rank writes its DCP shards);
  2. hash every file into checksums.json (format "sharded": every rank hashes a share of the shard
     files), fsync every file, then write meta.json (fsync'ed): from now on the directory is complete;
  3. rename it to its final name and fsync ckpt/, so the rename survives a crash;
  4. rotate: keep the newest `keep_last` complete checkpoints and the newest healthy one.
A kill at any point leaves the previous checkpoint as the latest complete one. A full disk removes the
partial copy and raises CheckpointError (one line). Non-finite weights are never written.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from mars.checkpoint import checksums
from mars.checkpoint import sharded as sharded_io
from mars.checkpoint.files import disk_full_as_error
from mars.checkpoint.layout import (
    CHECKSUMS,
    CKPT_DIR,
    META,
    RUN_CONFIG,
    SHARDED_DIR,
    TMP_PREFIX,
    TRAIN_STATE,
    list_checkpoints,
    read_meta,
    step_dirname,
)
from mars.checkpoint.model_dir import AVERAGE_PREFIX, save_average, save_model, save_model_config
from mars.errors import CheckpointError
from mars.files import fsync_dir, fsync_file, fsync_tree, write_atomic


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _all_ranks_ok(error: BaseException | None, collective: bool) -> None:
    """Raise on every rank when any rank failed (collective saves), with the first rank's message."""
    if not collective or not _distributed():
        if error is not None:
            raise error
        return
    box = [None if error is None else f"{type(error).__name__}: {error}"]
    messages = [None] * dist.get_world_size()
    dist.all_gather_object(messages, box[0])
    first = next((m for m in messages if m), None)
    if error is not None:
        raise error
    if first is not None:
        raise CheckpointError(f"checkpoint save failed on another rank: {first}")


def weights_finite(model: torch.nn.Module) -> bool:
    """All parameters finite; on sharded (DTensor) parameters, over every rank's shards."""
    ok = torch.tensor(1.0)
    collective = False
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        collective |= local is not p
        if not bool(torch.isfinite(local).all()):
            ok.zero_()
            break
    if collective and _distributed():
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok)


def save_checkpoint(
    run_dir: str | os.PathLike,
    step: int,
    model: torch.nn.Module,
    train_state: dict,
    meta: dict,
    config_yaml: str,
    keep_last: int,
    *,
    sharded: dict[str, torch.Tensor] | None = None,
    healthy: bool = True,
    average: dict[str, torch.Tensor] | None = None,
) -> Path | None:
    """Write RUN_DIR/ckpt/step_XXXXXXXX and rotate. Returns its path on rank 0 (None elsewhere).

    Format "full" (sharded=None): called on rank 0 only; `model` is the bare model (no DDP / compile
    wrapper), written as model.safetensors. Format "sharded": called on every rank with `sharded`, the
    tensors to write through DCP (the model's and the optimizer's DTensors); `model` only supplies
    model.json. train_state (plain data) and meta are rank 0's. `average`: the averaged weights by
    parameter name (mars.train.average), written as average.safetensors (format "full") or with the
    shards ("average.FQN", format "sharded").
    """
    collective = sharded is not None
    if collective and average:
        sharded = {**sharded, **{f"{AVERAGE_PREFIX}{k}": v for k, v in average.items()}}
    if not weights_finite(model):
        raise FloatingPointError(f"refusing to checkpoint non-finite weights at step {step}")
    root = Path(run_dir) / CKPT_DIR
    final = root / step_dirname(step)
    tmp = root / f"{TMP_PREFIX}{final.name}"
    main = _rank() == 0

    def remove_tmp() -> None:
        if main:
            shutil.rmtree(tmp, ignore_errors=True)

    error = None
    if main:
        try:
            with disk_full_as_error(tmp, cleanup=remove_tmp):
                root.mkdir(parents=True, exist_ok=True)
                if tmp.exists():
                    shutil.rmtree(tmp)
                tmp.mkdir()
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            error = e
    _all_ranks_ok(error, collective)

    sums: dict[str, dict] = {}
    if collective:
        share = None
        try:
            with disk_full_as_error(tmp / SHARDED_DIR, cleanup=remove_tmp):
                sharded_io.save_tensors(sharded, tmp / SHARDED_DIR)
            share = _hash_my_share(tmp)
        except Exception as e:  # noqa: BLE001
            error = e
        _all_ranks_ok(error, collective)
        sums = _gather(share)

    if main:
        try:
            with disk_full_as_error(tmp, cleanup=remove_tmp):
                if collective:
                    save_model_config(model, tmp)
                else:
                    save_model(model, tmp)
                    if average:
                        save_average(average, tmp)
                torch.save(train_state, tmp / TRAIN_STATE)
                (tmp / RUN_CONFIG).write_text(config_yaml, encoding="utf-8")
                rest = [rel for rel in checksums.summed_files(tmp) if rel not in sums]
                sums.update(checksums.digests(tmp, rest))
                (tmp / CHECKSUMS).write_text(checksums.checksums_text(sums), encoding="utf-8")
                fsync_tree(tmp)
                full_meta = {**meta, "step": step, "format": "sharded" if collective else "full"}
                full_meta["healthy"] = bool(healthy)
                full_meta["checksums"] = checksums.ALGORITHM
                (tmp / META).write_text(json.dumps(full_meta, indent=2) + "\n", encoding="utf-8")
                fsync_file(tmp / META)  # it marks the directory complete
                fsync_dir(tmp)
                _install(tmp, final, root)
        except Exception as e:  # noqa: BLE001
            error = e
    _all_ranks_ok(error, collective)
    if main:
        rotate(root, keep_last)
        return final
    return None


def _hash_my_share(tmp: Path) -> dict[str, dict]:
    """Checksums of this rank's share of the shard files (every rank hashes at once, none reads them all)."""
    world = dist.get_world_size() if _distributed() else 1
    shard_files = [rel for rel in checksums.summed_files(tmp) if rel.startswith(f"{SHARDED_DIR}/")]
    return checksums.digests(tmp, shard_files[_rank() :: world])


def _gather(share: dict[str, dict] | None) -> dict[str, dict]:
    if not _distributed():
        return dict(share or {})
    parts: list = [None] * dist.get_world_size()
    dist.all_gather_object(parts, share)
    return {rel: entry for part in parts for rel, entry in (part or {}).items()}


def _install(tmp: Path, final: Path, root: Path) -> None:
    """Rename tmp to final (swapping out an existing copy of the same step), fsync the parent."""
    if final.exists():  # re-saving a step (e.g. after a resume): swap out the old copy
        old = root / f"{TMP_PREFIX}old-{final.name}"
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    fsync_dir(root)


def is_healthy(step_dir: Path) -> bool:
    """meta.json's "healthy" flag (checkpoints written before the flag existed count as healthy)."""
    try:
        return bool(read_meta(step_dir).get("healthy", True))
    except CheckpointError:
        return False


def update_meta(step_dir: Path, **changes) -> None:
    """Rewrite fields of a checkpoint's meta.json in one step (the health verdicts the trainer learns
    after the save; meta.json is outside checksums.json)."""
    meta = read_meta(step_dir)
    meta.update(changes)
    write_atomic(Path(step_dir) / META, json.dumps(meta, indent=2) + "\n", fsync=True)


def _settled_healthy(step_dir: Path) -> bool:
    """Healthy, and saved with no gradient spike pending (one that a later alarm could still date the
    trouble from, which would mark it unhealthy: mars.train.health)."""
    try:
        meta = read_meta(step_dir)
    except CheckpointError:
        return False
    return bool(meta.get("healthy", True)) and meta.get("spike_pending") is None


def _marked_keep(step_dir: Path) -> bool:
    try:
        return bool(read_meta(step_dir).get("keep", False))
    except CheckpointError:
        return False


def rotate(ckpt_root: str | os.PathLike, keep_last: int) -> None:
    """Delete complete checkpoints beyond the newest `keep_last`, except the newest healthy one saved with
    no spike pending, those meta.json marks "keep" (saved at a step of train.ckpt_steps), and leftovers
    of interrupted saves."""
    root = Path(ckpt_root)
    found = list_checkpoints(root)
    keep = set(found[-keep_last:]) if keep_last > 0 else set(found)
    keep |= {p for p in found if _marked_keep(p)}
    healthy = [p for p in found if _settled_healthy(p)]
    if healthy:
        keep.add(healthy[-1])
    for old in found:
        if old not in keep:
            shutil.rmtree(old, ignore_errors=True)
    for leftover in root.glob(f"{TMP_PREFIX}*"):
        shutil.rmtree(leftover, ignore_errors=True)
