"""Where a prepared dataset lives, what its files are called, and which config made it.

Layout of a prepared dataset directory (``dataset_dir(cfg)``)::

    val_000000.bin ...     the held-out split: data.val_tokens tokens of documents drawn from the stream
                           by the split rule (mars.data.split)
    train_000000.bin ...   the other documents, data.shard_tokens tokens per shard (the last one shorter)
    progress.json          finished shards and where in the document stream each one ends (for resuming
                           and for rebuilding a damaged shard)
    manifest.json          written last: tokenizer, vocab size, dtype, source + config, tokens and sha256
                           per shard, skipped bad documents. A directory without it is not a dataset.
    .verified.json         shards whose sha256 was checked, by size and mtime (mars.data.integrity)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from mars.data.config import GPT2_TOKENIZER as GPT2
from mars.data.config import DataConfig
from mars.entry import hydra_value as _hydra_value
from mars.errors import DataError, ManifestError
from mars.files import project_root, write_atomic

FORMAT_VERSION = 1
DTYPE = "uint16"  # GPT-2's (and any vocabulary up to 65536 tokens); larger vocabularies get uint32 shards
DTYPES = ("uint16", "uint32")
MANIFEST = "manifest.json"
PROGRESS = "progress.json"
SPLITS = ("val", "train")
SHARD_RE = re.compile(r"^(train|val)_\d{6}\.bin$")
TMP_RE = re.compile(r"^\.(train|val)_\d{6}\.bin\.tmp-\d+$")  # a shard's mars.files.temp_name
# Config keys that decide which documents are read (a mismatch means a different dataset) and
# keys that only decide how many tokens go where.
IDENTITY_KEYS = (
    "name",
    "hf_path",
    "hf_config",
    "split",
    "revision",
    "text_field",
    "paths",
    "format",
    "sample_by",
    "python",
    "seed",
    "tokenizer",  # recorded only for a tokenizer other than GPT-2's (older manifests have neither)
    "tokenizer_sha256",
)
SIZE_KEYS = ("val_tokens", "shard_tokens", "token_budget")
# Keys that decide which documents are held out for validation (mars.data.split): recorded for every
# source but a shuffled one (the embedded corpus), absent from a manifest older than them (= null).
SPLIT_KEYS = ("split_seed",)
# DataConfig fields that only affect loading, never the prepared files.
_LOADER_ONLY = ("num_workers", "sequential", "verify")


def as_data_config(cfg: Any) -> DataConfig:
    """``cfg`` as a DataConfig: a DataConfig, an OmegaConf node (e.g. Hydra's ``cfg.data``) or a mapping."""
    if isinstance(cfg, DataConfig):
        return cfg
    if type(cfg).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(cfg, resolve=True)
    if not isinstance(cfg, dict):
        raise DataError(f"expected a data config (DataConfig or mapping), got {type(cfg).__name__}")
    known = {f.name for f in dataclasses.fields(DataConfig)}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise DataError(f"unknown data config keys {unknown}; known keys: {sorted(known)}")
    return DataConfig(**cfg)


def dataset_dir(cfg: DataConfig) -> Path:
    """{data.root}/{data.dir or data.name}, the name suffixed with the tokenizer's when it is not GPT-2's
    (data/embedded-my_tokenizer); a relative root is taken from the checkout (else the cwd)."""
    cfg = as_data_config(cfg)
    root = Path(os.path.expanduser(cfg.root))
    if not root.is_absolute():
        root = (project_root() or Path.cwd()) / root
    if cfg.dir:
        return root / cfg.dir
    if cfg.tokenizer != GPT2:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(cfg.tokenizer.rstrip("/")).name or cfg.tokenizer)
        return root / f"{cfg.name}-{slug}"
    return root / cfg.name


def requested_config(cfg: DataConfig) -> dict[str, Any]:
    """What ``cfg`` asks to be prepared, in the form the manifest records it under "config": the name,
    what its source class records (``Source.requested``), the tokenizer when not GPT-2's, the sizes and
    the split seed (not for a shuffled source: ``Source.shuffled``)."""
    cfg = as_data_config(cfg)
    from mars.data.registry import source_class

    out: dict[str, Any] = {"name": cfg.name, **source_class(cfg.name, cfg.hf_path).requested(cfg)}
    if cfg.tokenizer != GPT2:
        from mars.data.tokenizer import tokenizer_info

        out.update(tokenizer=cfg.tokenizer, tokenizer_sha256=tokenizer_info(cfg.tokenizer).sha256)
    out.update(val_tokens=cfg.val_tokens, shard_tokens=cfg.shard_tokens, token_budget=cfg.token_budget)
    if not source_class(cfg.name, cfg.hf_path).shuffled:
        out["split_seed"] = cfg.split_seed
    # Recorded, never compared: with it or without, a source gives the same shards or (without it, on a
    # bad document) none. The recorded value lets a rebuild skip the same documents again.
    out["skip_bad_documents"] = bool(cfg.skip_bad_documents)
    return out


# requested_config() key -> DataConfig field, where they differ.
_RECORDED_FIELDS = {"split": "hf_split", "revision": "hf_revision", "sample_by": "text_sample_by"}


def config_from_manifest(directory: Path, recorded: dict[str, Any]) -> DataConfig:
    """A DataConfig that prepares ``directory`` as its manifest's "config" records it.

    For advice when only the directory is known (``open_dir``): its prepare command rebuilds it.
    """
    name = str(recorded.get("name", "embedded"))
    values = group_defaults(name)
    known = {f.name for f in dataclasses.fields(DataConfig)}
    for key, value in recorded.items():
        key = _RECORDED_FIELDS.get(key, key)
        if key in known:
            values[key] = value
    values["name"] = name
    cfg = DataConfig(**{k: v for k, v in values.items() if k in known})
    cfg.root, cfg.dir = "data", None
    if dataset_dir(cfg).resolve() != directory.resolve():
        cfg.root = str(directory.parent.resolve())
        cfg.dir = None if directory.name == name else directory.name
    return cfg


def identity_keys(wanted: dict[str, Any]) -> tuple[str, ...]:
    """The keys of a requested config whose difference means other documents: IDENTITY_KEYS, and any
    other key a source records about its request (``Source.requested``)."""
    other = (*IDENTITY_KEYS, *SIZE_KEYS, *SPLIT_KEYS, "skip_bad_documents")
    return IDENTITY_KEYS + tuple(k for k in wanted if k not in other)


def config_differences(recorded: dict[str, Any], wanted: dict[str, Any], keys) -> list[str]:
    return [
        f"{k}: prepared {recorded.get(k)!r}, config {wanted.get(k)!r}"
        for k in keys
        if recorded.get(k) != wanted.get(k)
    ]


def _group_file(name: str) -> Path | None:
    """configs/data/NAME.yaml of the checkout, when there is one."""
    root = project_root()
    path = root / "configs" / "data" / f"{name}.yaml" if root else None
    return path if path is not None and path.is_file() else None


def group_defaults(name: str) -> dict[str, Any]:
    """The values ``data=NAME`` starts from: the DataConfig defaults, then configs/data/NAME.yaml."""
    defaults = dataclasses.asdict(DataConfig())
    group_file = _group_file(name)
    if group_file is not None:
        import yaml

        defaults.update(yaml.safe_load(group_file.read_text()) or {})
    return defaults


def prepare_command(cfg: DataConfig, **changes: Any) -> str:
    """The ``scripts/prepare_data.py`` command line that prepares exactly ``cfg``'s dataset (with the data
    keys in ``changes`` set instead, e.g. dir="NEW_NAME", each once)."""
    cfg = dataclasses.replace(as_data_config(cfg), **changes)
    defaults = group_defaults(cfg.name)
    group = f"data={cfg.name}" if _group_file(cfg.name) else f"data.name={_hydra_value(cfg.name)}"
    from mars.data.registry import find_source

    source = find_source(cfg.name, cfg.hf_path)
    hf_defaults = source.config_defaults if source is not None else {}
    overrides = [group]
    for f in dataclasses.fields(DataConfig):
        value = getattr(cfg, f.name)
        if isinstance(value, tuple):
            value = list(value)
        default = defaults.get(f.name)
        if f.name in hf_defaults:  # null means the source's default
            value, default = value or hf_defaults[f.name], default or hf_defaults[f.name]
        if f.name in _LOADER_ONLY or f.name == "name" or value == default:
            continue
        overrides.append(f"data.{f.name}={_hydra_value(value)}")
    return "python scripts/prepare_data.py " + " ".join(shlex.quote(o) for o in overrides)


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ManifestError(
            f"{path}: cannot be read as JSON ({e}). Delete it and prepare the dataset again."
        ) from e
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def write_json(path: Path, data: dict[str, Any]) -> None:
    """A dataset's JSON file (manifest, progress, verification cache), atomically and durably."""
    write_atomic(path, json.dumps(data, indent=1) + "\n", fsync=True)


@contextlib.contextmanager
def dir_lock(directory: Path):
    """An exclusive lock on ``directory`` so concurrent preparations (e.g. DDP ranks) do not interleave."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


READERS_LOCK = ".readers.lock"  # held shared by every run that trains on the dataset (mars.data.shards)


def read_lock(directory: Path) -> int | None:
    """A shared lock on ``directory``'s readers' lock, held by a training run while it reads the dataset
    (released when the returned descriptor is closed, or the process ends however it ends); None where
    the directory cannot take one (read-only: it cannot be re-split there either). DataError while a
    re-split rewrites the dataset."""
    try:
        fd = os.open(directory / READERS_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataError(
            f"{directory} is being prepared again (resplit=true) right now: start the run when that is done"
        ) from None
    return fd


@contextlib.contextmanager
def rewrite_lock(directory: Path):
    """The readers' lock held exclusively for the block: a dataset a live run reads is not rewritten."""
    fd = os.open(directory / READERS_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataError(
                f"resplit=true: {directory} is being read by a live training run: re-split it once no run "
                "reads it (a run resumed on it afterwards is refused, since its documents change)"
            ) from None
        yield
    finally:
        os.close(fd)


def clear(directory: Path) -> None:
    """Remove what a preparation writes (and only that) from ``directory``."""
    for p in directory.iterdir():
        if SHARD_RE.match(p.name) or TMP_RE.match(p.name) or p.name in (MANIFEST, PROGRESS, ".verified.json"):
            p.unlink()
