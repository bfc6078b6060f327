"""RUN_DIR/lineage.json: where a run began when it began from another run's checkpoint or weights.

A run that forks (train.fork_from) or starts from weights alone (train.init_from) records its source once,
when it starts (a resume of its own checkpoints keeps the file; mars.train.forks makes such runs):
    {"kind": "fork" | "init", "parent_run_dir": ..., "parent_checkpoint": ..., "step": N,
     "checksum_algorithm": "xxh3_128", "checksums": {FILE: HASH}, "format": "mars" | "hf", "time": ...}
"step" is the parent's step the branch starts after (0 for an HF directory); "checksums" is the hash
of the parent checkpoint's checksums.json (which covers every one of its files), or of the HF config
and weights files. Reading the record back and finding the parent where that hash says it is
(locate_parent) needs no training code: the reports (mars.analysis) read it here.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from mars.checkpoint.layout import CHECKSUMS, CKPT_DIR, META, REPLACED_PREFIX, read_meta

LINEAGE_FILE = "lineage.json"
HF_CONFIG = "config.json"
HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # what transformers' from_pretrained reads


def is_hf_dir(path: Path) -> bool:
    """A transformers model directory (config.json, no mars checkpoint files)."""
    return (path / HF_CONFIG).is_file() and not (path / META).is_file()


def lineage(kind: str, source: Path) -> dict:
    """The lineage.json record of a run that starts from `source` (a step dir, or an HF directory)."""
    from mars.checkpoint.checksums import ALGORITHM, file_digest

    source = source.resolve()
    if is_hf_dir(source):
        files = [HF_CONFIG, *(w for w in HF_WEIGHTS if (source / w).is_file())]
        return {
            "kind": kind,
            "format": "hf",
            "parent_run_dir": None,
            "parent_checkpoint": str(source),
            "step": 0,
            "checksum_algorithm": ALGORITHM,
            "checksums": {f: file_digest(source / f) for f in files},
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
    sums = source / CHECKSUMS
    return {
        "kind": kind,
        "format": "mars",
        "parent_run_dir": str(source.parent.parent),
        "parent_checkpoint": str(source),
        "step": int(read_meta(source)["step"]),
        "checksum_algorithm": ALGORITHM,
        "checksums": {sums.name: file_digest(sums)} if sums.is_file() else {},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def write_lineage(run_dir: str | os.PathLike, record: dict) -> None:
    from mars.files import write_atomic

    Path(run_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(Path(run_dir) / LINEAGE_FILE, json.dumps(record, indent=2) + "\n")


@dataclass
class Parent:
    """Where a run's parent is now, as lineage.json's checksum hash finds it."""

    run_dir: Path | None  # the run dir holding the parent's run now; None when it cannot be found
    note: str = ""  # empty when the parent is where lineage.json says, unchanged


def locate_parent(record: dict) -> Parent:
    """The parent run of a fork (or of a run begun from a mars checkpoint's weights), checked against the
    hash lineage.json holds of its checkpoint's checksums.json: still in its run dir; moved aside by a
    train.overwrite=true of that run dir (RUN_DIR/replaced-TIME/, found by the hash); or replaced or
    changed and not found (run_dir None). A checkpoint rotated away since cannot be checked: the run dir
    is taken as the parent unless a run was moved out of it after the fork."""
    from mars.checkpoint.checksums import file_digest
    from mars.metrics_jsonl import METRICS_FILE

    run = Path(str(record.get("parent_run_dir") or ""))
    step_dir = Path(str(record.get("parent_checkpoint") or ""))
    recorded = (record.get("checksums") or {}).get(CHECKSUMS)
    if record.get("format") == "hf" or not record.get("parent_run_dir"):
        return Parent(None, _hf_changed(step_dir, record.get("checksums") or {}))
    if recorded is None:
        return Parent(run)  # a record without the hash: nothing to check

    def matches(d: Path) -> bool:
        return (d / CHECKSUMS).is_file() and file_digest(d / CHECKSUMS) == recorded

    if matches(step_dir):
        return Parent(run)
    moved_runs = sorted(
        (d for d in run.glob(f"{REPLACED_PREFIX}*") if (d / METRICS_FILE).is_file()), reverse=True
    )
    for moved in sorted(run.glob(f"{REPLACED_PREFIX}*"), reverse=True):
        if matches(moved / CKPT_DIR / step_dir.name):
            if moved in moved_runs:
                return Parent(moved, f"its run dir was overwritten since: the parent run is now in {moved}")
            return Parent(run, f"its checkpoint was moved aside since, to {moved}")
    if step_dir.exists():
        return Parent(
            None, f"{step_dir} no longer matches lineage.json: the parent was replaced or changed since"
        )
    since = "".join(c for c in str(record.get("time", "")) if c.isdigit())
    after = [d for d in moved_runs if "".join(c for c in d.name if c.isdigit())[:14] >= since[:14]]
    if after:
        return Parent(None, f"its run dir was overwritten since (the earlier run moved to {after[0]}) and "
                      f"{step_dir.name} is gone: the parent cannot be found")  # fmt: skip
    return Parent(run, f"{step_dir.name} has been rotated away since: not checked")


def _hf_changed(source: Path, sums: dict) -> str:
    """An HF source's note: empty while its files match their recorded hashes."""
    from mars.checkpoint.checksums import file_digest

    for name, digest in sums.items():
        if not (source / name).is_file() or file_digest(source / name) != digest:
            return f"{source / name} has changed or is gone since"
    return ""


def read_lineage(run_dir: str | os.PathLike) -> dict | None:
    """RUN_DIR/lineage.json (None: the run began from scratch, or the file cannot be read)."""
    try:
        data = json.loads((Path(run_dir) / LINEAGE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
