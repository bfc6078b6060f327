"""Prepare datasets: ``prepare(cfg)`` (the prepare command) and ``ensure_prepared(cfg)`` (the trainer).

The directory layout and the config bookkeeping are in mars.data.layout, the tokenizing shard
writer in mars.data.writer, the document sources in mars.data.sources.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import replace
from pathlib import Path

from mars.data.config import DataConfig
from mars.data.errors import DataNotPreparedError, ManifestError, SourceChangedError
from mars.data.layout import (
    IDENTITY_KEYS,
    MANIFEST,
    PROGRESS,
    SIZE_KEYS,
    as_data_config,
    clear,
    config_differences,
    dataset_dir,
    dir_lock,
    prepare_command,
    read_json,
    requested_config,
)
from mars.data.writer import repair_shards, summary, write_shards

__all__ = ["dataset_dir", "ensure_prepared", "prepare", "prepare_command"]

log = logging.getLogger(__name__)


def _manifest_matches(path: Path, cfg: DataConfig) -> bool:
    """True when ``path`` holds a finished preparation of exactly ``cfg``'s dataset."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return False
    recorded = read_json(manifest).get("config", {})
    return not config_differences(recorded, requested_config(cfg), IDENTITY_KEYS + SIZE_KEYS)


def prepare(cfg: DataConfig, *, progress_bar: bool = True) -> Path:
    """Prepare ``cfg``'s dataset, resuming an interrupted run or repairing a finished one; return its dir.

    A directory that already holds this dataset has every shard checked (sizes; sha256 unless
    ``.verified.json`` vouches for the file) and any missing or damaged one rebuilt from the source,
    one line printed per repaired shard. One that holds a different dataset raises ManifestError,
    except for the embedded corpus, which is rebuilt (it is derived from the Python install and takes
    seconds) -- as it is when it cannot be repaired in place.
    """
    from mars.data.sources import get_source

    cfg = as_data_config(cfg)

    out = dataset_dir(cfg)
    wanted = requested_config(cfg)
    hint = (
        f"restore the source files as they were, or delete {out} and run `{prepare_command(cfg)}` "
        f"to prepare it from the current ones"
    )
    sizes = dict(val_tokens=cfg.val_tokens, shard_tokens=cfg.shard_tokens, token_budget=cfg.token_budget)
    with dir_lock(out):
        manifest = out / MANIFEST
        if manifest.is_file():
            recorded = read_json(manifest).get("config", {})
            diffs = config_differences(recorded, wanted, IDENTITY_KEYS + SIZE_KEYS)
            if diffs and cfg.name != "embedded":
                raise ManifestError(
                    f"{manifest}: {out} already holds a different preparation ({'; '.join(diffs)}). "
                    f"Delete {out} or choose another data.dir."
                )
            if not diffs:
                # a rebuilt shard must skip the documents its preparation skipped, whatever cfg says
                skip = cfg.skip_bad_documents or bool(recorded.get("skip_bad_documents"))
                try:
                    repaired = repair_shards(
                        lambda: get_source(replace(cfg, skip_bad_documents=skip)),
                        out,
                        **sizes,
                        workers=cfg.num_workers,
                        progress_bar=progress_bar,
                        hint=hint,
                    )
                except (SourceChangedError, ManifestError) as e:
                    if cfg.name != "embedded":
                        raise
                    log.warning("%s; rebuilding the embedded corpus", e)
                    clear(out)
                else:
                    note = f"{len(repaired)} shard(s) repaired" if repaired else "already prepared"
                    print(f"{summary(out, read_json(manifest))} ({note})", flush=True)
                    return out
        if cfg.name == "embedded":
            progress = out / PROGRESS
            stale = manifest.is_file() or (
                progress.is_file()
                and config_differences(
                    read_json(progress).get("config", {}), wanted, IDENTITY_KEYS + SIZE_KEYS
                )
            )
            if stale:
                log.info("rebuilding the embedded corpus in %s for %s", out, wanted)
                clear(out)
        source = get_source(cfg)
        try:
            write_shards(
                source, out, wanted, **sizes, workers=cfg.num_workers, progress_bar=progress_bar, hint=hint
            )
        except SourceChangedError as e:
            if cfg.name != "embedded":
                raise
            # the Python install changed under an interrupted preparation: start over from this one
            log.warning("%s; rebuilding the embedded corpus", e)
            clear(out)
            write_shards(
                get_source(cfg), out, wanted, **sizes, workers=cfg.num_workers, progress_bar=progress_bar
            )
    return out


def ensure_prepared(cfg: DataConfig) -> Path:
    """The dataset directory of ``cfg``, prepared.

    The embedded corpus is prepared on first use. Any other source raises DataNotPreparedError
    holding the exact prepare command; a directory prepared with other settings raises ManifestError
    (different documents) or warns (different sizes: the prepared split is used).
    """
    cfg = as_data_config(cfg)
    out = dataset_dir(cfg)
    if cfg.name == "embedded":
        return out if _manifest_matches(out, cfg) else prepare(cfg)
    manifest = out / MANIFEST
    if not manifest.is_file():
        partial = (
            " (an interrupted preparation is there: the command resumes it)"
            if (out / PROGRESS).is_file()
            else ""
        )
        raise DataNotPreparedError(
            f"{out} holds no prepared dataset: {manifest} is missing{partial}. Prepare it with:\n"
            f"    {prepare_command(cfg)}"
        )
    recorded = read_json(manifest).get("config", {})
    wanted = requested_config(cfg)
    diffs = config_differences(recorded, wanted, IDENTITY_KEYS)
    if diffs:
        raise ManifestError(
            f"{manifest}: {out} was prepared from other documents than the config asks for "
            f"({'; '.join(diffs)}). "
            f"Pass the settings it was prepared with, or prepare into another directory: "
            f"{prepare_command(cfg)} data.dir=NEW_NAME"
        )
    sizes = config_differences(recorded, wanted, SIZE_KEYS)
    if sizes:
        warnings.warn(
            f"{out} was prepared with other sizes ({'; '.join(sizes)}); using it as prepared", stacklevel=2
        )
    return out
