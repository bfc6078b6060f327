"""One run per run dir: a run holds an OS lock on its run dir for as long as it lives.

The lock is ``fcntl.flock`` on RUN_DIR/.run.lock (the same mechanism as the GPU slots of a sweep,
mars/train/launch.py): the kernel drops it when the process ends, however it ends (a crash, SIGKILL,
power loss), so a stale lock cannot exist and nothing has to be cleaned up. The file itself stays,
holding the last holder's pid, host, start time and command, which a refused run quotes. It is taken
before Hydra writes anything into the run dir (mars.train.cli.main) and again, re-entrantly, by the
job itself (mars.train.cli.run: every job of a sweep, each in its own run dir). Under torchrun only
rank 0 takes it: the other ranks share rank 0's run dir and live no longer than rank 0's job.
A -m sweep also holds its sweep dir, so two sweeps cannot write into one.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from mars.errors import RunDirBusyError, UserError

LOCK_FILE = ".run.lock"
NOTE_WAIT_S = 3.0  # how long a refused run waits for the holder's note (written just after the lock)

_held: dict[Path, int] = {}  # run dirs this process holds -> the lock file's descriptor


def _recorded(fd: int) -> dict | None:
    """The holder's note in the lock file, or None while there is none (or only part of one)."""
    try:
        info = json.loads(os.pread(fd, 1 << 16, 0).decode("utf-8") or "{}")
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and "pid" in info else None


def _alive_here(info: dict) -> bool:
    """False only when the note names a process of this host that has ended (a previous holder's note,
    read before the new holder rewrote it)."""
    if info.get("host") != socket.gethostname():
        return True  # another node's process: it cannot be checked from here
    try:
        os.kill(int(info["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True
    return True


def _holder(fd: int) -> str:
    """Who holds the lock, from its note. The holder writes its note just after taking the lock, so a
    run refused in that instant waits (at most NOTE_WAIT_S) for the note rather than naming nobody
    or the previous holder."""
    deadline = time.monotonic() + NOTE_WAIT_S
    while True:
        info = _recorded(fd)
        if info is not None and _alive_here(info):
            break
        if time.monotonic() >= deadline:
            return "another process (it has not recorded its pid)"
        time.sleep(0.02)
    text = f"process {info['pid']} on {info.get('host', '?')}, started {info.get('started', '?')}"
    if info.get("command"):
        text += f": {info['command']}"
    return text


def held(run_dir: str | os.PathLike) -> bool:
    """True when this process holds the lock of run_dir."""
    return Path(run_dir).resolve() in _held


def busy(run_dir: str | os.PathLike) -> bool:
    """True when a live process (this one or another) holds the lock of run_dir."""
    if held(run_dir):
        return True
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _open_lock_file(path: Path, key: str) -> int:
    """The descriptor of path/LOCK_FILE (path created if missing); UserError when it cannot be."""
    lock = path / LOCK_FILE
    try:
        path.mkdir(parents=True, exist_ok=True)
        return os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)  # not truncated: it names the holder
    except IsADirectoryError:
        raise UserError(
            f"{lock} is a directory, where a run keeps its lock file: remove it if it is empty "
            f"(rmdir {lock}) or move it away, or choose another {key}"
        ) from None
    except OSError as e:
        raise UserError(
            f"{key}={path}: cannot open its lock file {lock} ({e.strerror or e}); choose another {key}"
        ) from None


@contextmanager
def hold(run_dir: str | os.PathLike, key: str = "hydra.run.dir"):
    """Hold run_dir for the block (created if missing); RunDirBusyError when a live process holds it,
    UserError when its lock file cannot be opened (a directory in its place). Re-entrant within a
    process. `key` names the setting to change in the refusal."""
    path = Path(run_dir).resolve()
    if path in _held:
        yield path
        return
    fd = _open_lock_file(path, key)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise RunDirBusyError(
            f"{key}={path} is in use by a live run ({holder}); a run dir holds one run at a time: wait "
            f"for that run to end (to continue it then: train.resume=auto), or choose another {key}",
            holder,
        ) from None
    except BaseException:
        os.close(fd)
        raise
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])[:500],
    }
    try:
        note = (json.dumps(info) + "\n").encode("utf-8")
        os.pwrite(fd, note, 0)  # over the previous note, then cut: the file is never empty
        os.ftruncate(fd, len(note))
    except OSError:
        pass  # the lock holds without the note
    _held[path] = fd
    try:
        yield path
    finally:
        del _held[path]
        os.close(fd)  # releases the lock
