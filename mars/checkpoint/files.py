"""Durable file writing for checkpoints: fsync before a file counts, and a full disk as one clear error."""

from __future__ import annotations

import errno
import os
import re
from contextlib import contextmanager
from pathlib import Path

from mars.checkpoint.layout import CheckpointError

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class DiskFullError(CheckpointError):
    """The disk (or quota) filled up while writing a checkpoint; the partial copy was removed."""


def is_disk_full(err: BaseException) -> bool:
    while err is not None:
        if isinstance(err, OSError) and err.errno in _NO_SPACE:
            return True
        if "No space left on device" in str(err) or "Disk quota exceeded" in str(err):
            return True  # libraries (safetensors, DCP) sometimes re-raise the OSError as text
        err = err.__cause__ or err.__context__
    return False


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


def write_text_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def disk_full_as_error(what: Path, cleanup=None):
    """On an error while writing `what`, call `cleanup` (remove the partial copy); an out-of-space error
    becomes DiskFullError. An interrupt (KeyboardInterrupt) passes untouched: the next save clears the
    leftover, like one left by a kill."""
    try:
        yield
    except Exception as e:
        if cleanup is not None:
            cleanup()
        if is_disk_full(e):
            raise DiskFullError(
                f"no space left on the device while writing {what}: the partial checkpoint was removed and "
                "the previous checkpoint is intact; free disk space, then continue with train.resume=auto"
            ) from e
        raise


# what torch.load says when a file fails weights_only=True: advice to retry unsafely, which must never be
# passed on about a file that just failed the safe check
_UNSAFE_ADVICE = ("weights_only", "Re-running", "trusted source", "arbitrary code", "In PyTorch 2.6")
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def load_error_reason(e: BaseException) -> str:
    """What went wrong reading a file, in a few words, without any advice to load it unsafely."""
    text = str(e).strip()
    found = _GLOBAL.search(text)
    if found:
        return f"it holds a Python object this harness never writes ({found.group(1)}), refused unread"
    sentences = [
        part.strip()
        for part in re.split(r"(?<=[.!?])\s+|\n+", text)
        if part.strip() and not any(word in part for word in _UNSAFE_ADVICE)
    ]
    reason = " ".join(sentences[:2]) or type(e).__name__
    return reason[:200]
