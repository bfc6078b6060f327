"""Checksums that let a checkpoint prove its bytes: written before the completion marker, verified on load.

    STEP_DIR/checksums.json   {"algorithm": "xxh3_128",
                               "files": {"model.safetensors": {"size": N, "xxh3_128": "..."}, ...}}

Every file of the step directory is listed (sharded/ included) except meta.json, which is written after
it and whose "checksums" field names the algorithm: a checkpoint whose meta.json has that field and no
(valid) checksums.json is refused, one written before checksums existed loads with a note.

The hash is xxHash's XXH3-128 (the xxhash package, which datasets and wandb already require): not
cryptographic, but made to catch accidental changes (a bit flip, a truncated or bad copy) and fast enough
that a GB-sized file costs well under a second beyond reading it (docs/reliability.md has a figure).
A sharded save hashes its files on every rank at once, each rank a share of them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from mars.checkpoint.layout import CHECKSUMS, META, CheckpointError, read_json_object

ALGORITHM = "xxh3_128"
CHUNK = 16 << 20  # bytes per read

log = logging.getLogger("mars.checkpoint")
_noted: set[Path] = set()


def file_digest(path: str | os.PathLike) -> str:
    """XXH3-128 of a file's bytes (hex), read in large chunks into one reused buffer."""
    import xxhash

    h = xxhash.xxh3_128()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            h.update(view[:n])
    return h.hexdigest()


def summed_files(step_dir: Path) -> list[str]:
    """The files of a step directory that checksums.json covers, as sorted relative POSIX paths."""
    out = []
    for dirpath, _, files in os.walk(step_dir):
        for name in files:
            rel = (Path(dirpath) / name).relative_to(step_dir).as_posix()
            if rel not in (META, CHECKSUMS):
                out.append(rel)
    return sorted(out)


def digests(step_dir: Path, rels: Iterable[str]) -> dict[str, dict]:
    """{relative path: {"size", ALGORITHM}} of the given files."""
    out = {}
    for rel in rels:
        path = step_dir / rel
        out[rel] = {"size": path.stat().st_size, ALGORITHM: file_digest(path)}
    return out


def checksums_text(entries: dict[str, dict]) -> str:
    return json.dumps({"algorithm": ALGORITHM, "files": dict(sorted(entries.items()))}, indent=1) + "\n"


def _note_unverified(step_dir: Path) -> None:
    key = step_dir.resolve()
    if key not in _noted:
        _noted.add(key)
        log.warning(
            f"note: {step_dir} was written before checkpoints carried checksums: its files are checked "
            "for readability and finite weights only"
        )


def verify(step_dir: str | os.PathLike, meta: dict, only: Callable[[str], bool] | None = None) -> bool:
    """Compare the files of a checkpoint (those `only` accepts) with its checksums.json: CheckpointError
    naming the first file whose size or bytes differ. False (with a note, once) for a checkpoint written
    before checksums existed (meta.json without "checksums")."""
    step_dir = Path(step_dir)
    if "checksums" not in meta:
        _note_unverified(step_dir)
        return False
    file = step_dir / CHECKSUMS
    if not file.is_file():
        raise CheckpointError(
            f"{file} is missing, but {step_dir / META} says the checkpoint has checksums: its files cannot "
            "be verified; use another checkpoint, or copy this one again completely"
        )
    record = read_json_object(file)
    files = record.get("files")
    algorithm = record.get("algorithm")
    if algorithm != ALGORITHM or not isinstance(files, dict):
        raise CheckpointError(
            f"{file}: expected {{'algorithm': '{ALGORITHM}', 'files': {{...}}}}, found algorithm "
            f"{algorithm!r}; use a checkpoint written by this version of mars"
        )
    for rel, entry in sorted(files.items()):
        if only is not None and not only(rel):
            continue
        path = step_dir / rel
        if not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or ALGORITHM not in entry:
            raise CheckpointError(f"{file}: the entry of {rel} should hold 'size' and '{ALGORITHM}'")
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise CheckpointError(
                f"{path} is missing (listed in {file}); use another checkpoint, or copy this one again"
            ) from None
        if size != entry["size"]:
            raise CheckpointError(
                f"{path} has {size} bytes, {file} records {entry['size']}: the file was truncated or changed "
                "after the checkpoint was written; use another checkpoint, or copy this one again"
            )
        if file_digest(path) != entry[ALGORITHM]:
            raise CheckpointError(
                f"{path}: its bytes do not match the {ALGORITHM} checksum in {file}: the file changed after "
                "the checkpoint was written (a bit flip, a bad copy); use another checkpoint, or copy this "
                "one again"
            )
    return True
