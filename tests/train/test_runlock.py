"""The run dir lock names its holder even when a run is refused in the instant between the holder
taking the lock and writing its note (the race two runs started at once in one run dir meet)."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from mars.train import runlock


def _take_without_note(run_dir, note: dict | None, delay: float):
    """Hold run_dir's lock as a run does, but write its note only after `delay` seconds."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / runlock.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def write_later():
        time.sleep(delay)
        if note is not None:
            data = (json.dumps(note) + "\n").encode()
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))

    writer = threading.Thread(target=write_later)
    writer.start()
    return fd, writer


def _note(pid: int) -> dict:
    return {"pid": pid, "host": socket.gethostname(), "started": "now", "command": "train.py"}


def test_a_run_refused_before_the_holder_wrote_its_note_waits_for_it(tmp_path):
    fd, writer = _take_without_note(tmp_path / "run", _note(os.getpid()), delay=0.3)
    try:
        with pytest.raises(runlock.RunDirBusyError) as refused:
            with runlock.hold(tmp_path / "run"):
                pass
        assert refused.value.holder.startswith(f"process {os.getpid()} on {socket.gethostname()}")
    finally:
        writer.join()
        os.close(fd)


def test_the_previous_holders_note_is_not_taken_for_the_new_holder(tmp_path):
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(ended.stdout)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / runlock.LOCK_FILE).write_text(json.dumps(_note(dead_pid)) + "\n")  # a finished run's
    fd, writer = _take_without_note(tmp_path / "run", _note(os.getpid()), delay=0.3)
    try:
        with pytest.raises(runlock.RunDirBusyError) as refused:
            with runlock.hold(tmp_path / "run"):
                pass
        assert refused.value.holder.startswith(f"process {os.getpid()} on")
    finally:
        writer.join()
        os.close(fd)


def test_a_holder_that_never_writes_its_note_is_still_refused_in_bounded_time(tmp_path, monkeypatch):
    fd, writer = _take_without_note(tmp_path / "run", None, delay=0)
    monkeypatch.setattr(runlock, "NOTE_WAIT_S", 0.2)
    try:
        start = time.monotonic()
        with pytest.raises(runlock.RunDirBusyError, match=r"in use by a live run \(another process"):
            with runlock.hold(tmp_path / "run"):
                pass
        assert time.monotonic() - start < 5
    finally:
        writer.join()
        os.close(fd)
