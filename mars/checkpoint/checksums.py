"""Checksums that let a checkpoint prove its bytes: written before the completion marker, verified on load.

    STEP_DIR/checksums.json   {"algorithm": "xxh3_128",
                               "files": {"model.safetensors": {"size": N, "xxh3_128": "..."}, ...}}

Every file of the step directory is listed (sharded/ included) except meta.json, which is written after
it and whose "checksums" field names the algorithm: a checkpoint whose meta.json has that field and no
(valid) checksums.json is refused, one written before checksums existed loads with a note.

Verifying reads only what the checkpoint itself holds, and no more than checksums.json expects: an
entry must name a path inside the step directory (no absolute path, no `..`), the file must be a
regular file (a device, a FIFO or a directory is refused before it is opened for reading) of exactly
the recorded size, and at most that many bytes are read; a file of the step directory that the record
does not list is refused too (it would be read unverified).

The hash is xxHash's XXH3-128 (the xxhash package, which datasets and wandb already require): not
cryptographic, but made to catch accidental changes (a bit flip, a truncated or bad copy) and fast enough
that a GB-sized file costs well under a second beyond reading it (docs/reliability.md has a figure).
A sharded save hashes its files on every rank at once, each rank a share of them.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import stat
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath

from mars.checkpoint.layout import CHECKSUMS, META, read_json_object
from mars.errors import CheckpointError

ALGORITHM = "xxh3_128"
CHUNK = 16 << 20  # bytes per read

log = logging.getLogger("mars.checkpoint")
_noted: set[Path] = set()


def file_digest(path: str | os.PathLike, size: int | None = None) -> str:
    """XXH3-128 of a file's bytes (hex), read in large chunks into one reused buffer; with `size`, of
    its first `size` bytes at most (verification never reads more than a checkpoint records)."""
    import xxhash

    h = xxhash.xxh3_128()
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    left = -1 if size is None else size
    with open(path, "rb", buffering=0) as f:
        while left and (n := f.readinto(view if left < 0 or left >= CHUNK else view[:left])):
            h.update(view[:n])
            left = left - n if left > 0 else left
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
    naming the first entry that names a path outside the checkpoint, the first such file that is not
    listed, or whose kind, size or bytes differ. False (with a note, once) for a checkpoint written
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
    outside = next((rel for rel in sorted(files) if not _inside(rel)), None)
    if outside is not None:
        raise CheckpointError(
            f"{file}: the entry {outside!r} is not a path inside {step_dir} (a checkpoint lists only its "
            "own files, as relative paths without '..'); use another checkpoint, or copy this one again"
        )
    wanted = [rel for rel in sorted(files) if only is None or only(rel)]
    unlisted = [rel for rel in summed_files(step_dir) if rel not in files and (only is None or only(rel))]
    if unlisted:
        more = f" (and {len(unlisted) - 1} more file(s))" if len(unlisted) > 1 else ""
        raise CheckpointError(
            f"{step_dir / unlisted[0]}{more} is not listed in {file}, which records every file of the "
            "checkpoint when it is written: it was added since (or the record was edited) and cannot be "
            "verified; remove it if it is not part of the checkpoint, or use another checkpoint"
        )
    for rel in wanted:
        entry = files[rel]
        if not isinstance(entry, dict) or not _size(entry.get("size")) or ALGORITHM not in entry:
            raise CheckpointError(f"{file}: the entry of {rel} should hold 'size' and '{ALGORITHM}'")
        _check_file(step_dir / rel, entry, file)
    return True


def _inside(rel: object) -> bool:
    """A relative POSIX path in normal form that stays inside its directory."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        return False
    path = PurePosixPath(rel)
    return not path.is_absolute() and ".." not in path.parts and posixpath.normpath(rel) == rel


def _size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_file(path: Path, entry: dict, file: Path) -> None:
    """The file is a regular file of the recorded size whose first `size` bytes hash as recorded."""
    try:
        info = path.stat()  # follows a symlink (a checkpoint kept by DVC or git-annex); never blocks
    except FileNotFoundError:
        raise CheckpointError(
            f"{path} is missing (listed in {file}); use another checkpoint, or copy this one again"
        ) from None
    except OSError as e:
        raise CheckpointError(f"{path} cannot be read ({e.strerror or e}), listed in {file}") from None
    if not stat.S_ISREG(info.st_mode):
        raise CheckpointError(
            f"{path} is not a regular file (listed in {file}): a checkpoint holds only regular files; use "
            "another checkpoint, or copy this one again"
        )
    if info.st_size != entry["size"]:
        raise CheckpointError(
            f"{path} has {info.st_size} bytes, {file} records {entry['size']}: the file was truncated or "
            "changed after the checkpoint was written; use another checkpoint, or copy this one again"
        )
    if file_digest(path, size=entry["size"]) != entry[ALGORITHM]:
        raise CheckpointError(
            f"{path}: its bytes do not match the {ALGORITHM} checksum in {file}: the file changed after "
            "the checkpoint was written (a bit flip, a bad copy); use another checkpoint, or copy this "
            "one again"
        )
