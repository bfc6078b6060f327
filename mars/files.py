"""Writing files so that nothing is half-written: the one atomic write, fsync for durability, and
whether a directory can be created somewhere (tried before a run dir or a dataset is made).

write_atomic(path, data) writes a temporary file beside `path` and renames it over `path`, so a
reader, or a run killed mid-write, sees the old file whole or the new one whole. With fsync=True the
new contents reach the disk before the rename (data shards, manifests, checkpoint files); the rename
itself survives a power loss once the caller fsyncs the directory (fsync_dir), as checkpoints do.

Standard library only: mars.data, mars.model, mars.checkpoint, mars.eval and mars.train all write
through it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

Data = str | bytes | memoryview | Callable[[Path], object]


def temp_name(path: Path) -> Path:
    """The temporary file write_atomic writes `path` through: hidden, beside it, and this process's own."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_atomic(path: str | os.PathLike, data: Data, *, fsync: bool = False) -> Path:
    """Replace `path` with `data` in one step; returns the path.

    data: text (written as UTF-8), bytes-like (bytes, a memoryview of an array), or a function that
    writes the file at the path it is given (e.g. safetensors' save_file). fsync: flush the contents
    to the disk before the rename. On an error the temporary file is removed and `path` is untouched."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        if callable(data):
            data(tmp)
        else:
            with open(tmp, "wb") as f:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
        if fsync:
            fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    return path


def nearest_existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def try_create_dir_in(base: Path) -> None:
    """Create a directory in `base` and remove it again: OSError (NotADirectoryError for a file) where
    that fails. Tried rather than read from permission bits, which say nothing for root or a read-only
    mount."""
    if not base.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(base))
    os.rmdir(tempfile.mkdtemp(prefix=".mars-write-test-", dir=base))


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """fsync a directory, so that a rename or a new entry in it survives a power loss."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems do not support fsync on directories
        pass
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file under root, then every directory (deepest first)."""
    dirs = []
    for dirpath, _, files in os.walk(root):
        dirs.append(Path(dirpath))
        for f in files:
            fsync_file(Path(dirpath) / f)
    for d in reversed(dirs):
        fsync_dir(d)


def project_root() -> Path | None:
    """The source checkout this package runs from (holding pyproject.toml and configs/), if any."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "configs").is_dir() else None
