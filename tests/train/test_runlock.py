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


def _refused_while(run_dir, note: dict | None, delay: float) -> str:
    """Hold run_dir's lock as a run does, writing its note only after `delay` seconds (None: never), and
    meanwhile try to take it: the holder the refusal names."""
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
    try:
        with pytest.raises(runlock.RunDirBusyError) as refused:
            with runlock.hold(run_dir):
                pass
        return refused.value.holder
    finally:
        writer.join()
        os.close(fd)


def _note(pid: int) -> dict:
    return {"pid": pid, "host": socket.gethostname(), "started": "now", "command": "train.py"}


def test_a_run_refused_before_the_holder_wrote_its_note_waits_for_it(tmp_path, monkeypatch):
    monkeypatch.setattr(runlock, "NOTE_WAIT_S", 300.0)  # however late the writer thread runs under load
    holder = _refused_while(tmp_path / "run", _note(os.getpid()), delay=0.3)
    assert holder.startswith(f"process {os.getpid()} on {socket.gethostname()}")


def test_the_previous_holders_note_is_not_taken_for_the_new_holder(tmp_path, monkeypatch):
    monkeypatch.setattr(runlock, "NOTE_WAIT_S", 300.0)
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (tmp_path / "run").mkdir()
    finished = json.dumps(_note(int(ended.stdout))) + "\n"  # a finished run's note, still in the file
    (tmp_path / "run" / runlock.LOCK_FILE).write_text(finished)
    assert _refused_while(tmp_path / "run", _note(os.getpid()), delay=0.3).startswith(
        f"process {os.getpid()} on"
    )


def test_a_holder_that_never_writes_its_note_is_still_refused_in_bounded_time(tmp_path, monkeypatch):
    """NOTE_WAIT_S on runlock's own clock (a fake one here, which each sleep advances: no real time, so
    no load on the machine can change the count)."""

    class Clock:
        now = 0.0

        def monotonic(self):
            return self.now

        def sleep(self, s):
            self.now += s

        def __getattr__(self, name):
            return getattr(time, name)

    clock = Clock()
    monkeypatch.setattr(runlock, "time", clock)
    monkeypatch.setattr(runlock, "NOTE_WAIT_S", 0.2)
    assert _refused_while(tmp_path / "run", None, delay=0) == "another process (it has not recorded its pid)"
    assert 0.2 <= clock.now < 0.25
