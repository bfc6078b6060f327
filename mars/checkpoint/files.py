"""Failures of checkpoint files: a full disk while writing as one clear error, and why a file could not
be read, without advice to load it unsafely. (Durable writing itself is mars.files.)"""

from __future__ import annotations

import errno
import re
from contextlib import contextmanager
from pathlib import Path

from mars.errors import CheckpointError

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def is_disk_full(err: BaseException) -> bool:
    while err is not None:
        if isinstance(err, OSError) and err.errno in _NO_SPACE:
            return True
        if "No space left on device" in str(err) or "Disk quota exceeded" in str(err):
            return True  # libraries (safetensors, DCP) sometimes re-raise the OSError as text
        err = err.__cause__ or err.__context__
    return False


@contextmanager
def disk_full_as_error(what: Path, cleanup=None):
    """On an error while writing `what`, call `cleanup` (remove the partial copy); an out-of-space error
    becomes CheckpointError. An interrupt (KeyboardInterrupt) passes untouched: the next save clears the
    leftover, like one left by a kill."""
    try:
        yield
    except Exception as e:
        if cleanup is not None:
            cleanup()
        if is_disk_full(e):
            raise CheckpointError(
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
