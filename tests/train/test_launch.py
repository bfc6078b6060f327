"""Sweep jobs on GPUs of their own: slots, locks and the job command (no GPU needed)."""

from __future__ import annotations

import sys

import pytest

from mars.train.config import ConfigError
from mars.train.launch import claim_slot, gpu_slots, job_command


def test_gpu_slots_are_disjoint_sets():
    assert gpu_slots(["0", "1", "2", "3"], 1) == [["0"], ["1"], ["2"], ["3"]]
    assert gpu_slots(["0", "1", "2", "3", "4"], 2) == [["0", "1"], ["2", "3"]]  # GPU 4 cannot form a pair
    with pytest.raises(ConfigError, match="launch.gpus_per_job=4 but this machine shows 2 GPU"):
        gpu_slots(["0", "1"], 4)


def test_a_claimed_slot_is_not_given_twice(tmp_path):
    slots = [["0", "1"], ["2", "3"]]
    with claim_slot(tmp_path, slots) as first:
        with claim_slot(tmp_path, slots) as second:
            assert first == ["0", "1"] and second == ["2", "3"]
            with pytest.raises(TimeoutError), claim_slot(tmp_path, slots, poll_s=0.01, timeout_s=0.05):
                pass
        with claim_slot(tmp_path, slots, poll_s=0.01, timeout_s=1) as again:  # freed on exit
            assert again == ["2", "3"]


def test_job_command_runs_the_job_in_its_own_run_dir(tmp_path):
    one = job_command(1, ["optimizer.lr=0.001"], tmp_path)
    assert one == [
        sys.executable, "-m", "mars.train", "optimizer.lr=0.001", f"hydra.run.dir={tmp_path}",
        "launch.gpus_per_job=0",
    ]  # fmt: skip
    two = job_command(2, ["optimizer.lr=0.001"], tmp_path)
    assert two[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert two[5:7] == ["-m", "mars.train"] and two[-1] == "launch.gpus_per_job=0"


SAVES_ON_CTRL_C = """
import signal, sys, time
from pathlib import Path

signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the Ctrl-C of the test reaches only the test process)
marker, release = Path(sys.argv[1]), Path(sys.argv[2])
marker.write_text("started")
deadline = time.monotonic() + 300
while not release.exists() and time.monotonic() < deadline:  # until the test has sent its Ctrl-C
    time.sleep(0.01)
time.sleep(0.5)  # finishing the step and saving a checkpoint
marker.write_text("saved")
"""


def test_a_job_is_waited_for_after_ctrl_c(tmp_path):
    """run_job lets an interrupted job save before the interrupt goes on (subprocess.run kills it)."""
    import os
    import signal
    import threading
    import time

    from mars.train.launch import run_job

    script, marker, release = tmp_path / "job.py", tmp_path / "state", tmp_path / "release"
    script.write_text(SAVES_ON_CTRL_C)

    def ctrl_c_once_started():
        """The job cannot end before this Ctrl-C, however late this thread runs: it waits for `release`."""
        deadline = time.monotonic() + 300
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)
        release.touch()

    threading.Thread(target=ctrl_c_once_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_job([sys.executable, str(script), str(marker), str(release)], dict(os.environ))
    assert marker.read_text() == "saved"
