"""The step-time split's CUDA path (mars.train.step_time) on the stand-in's events, which fail where torch's
do: Event.elapsed_time before the end event completed raises. Three events a step, none read in the
step; collect() synchronizes first, then reads them all. In this process, only torch.cuda.Event and
torch.cuda.synchronize are replaced (for this test alone)."""

from __future__ import annotations

import pytest
import standin_cuda
import torch

from mars.train import step_time
from mars.train.step_time import StepTimes


@pytest.fixture
def events(monkeypatch):
    machine = standin_cuda.Machine(1)
    monkeypatch.setattr(standin_cuda, "MACHINE", machine)
    monkeypatch.setattr(torch.cuda, "Event", standin_cuda.Event, raising=False)
    monkeypatch.setattr(torch.cuda, "synchronize", standin_cuda.synchronize)
    return machine


def work() -> None:
    x = torch.randn(64, 64)
    for _ in range(20):
        x = x @ x / 64


def test_events_are_recorded_every_step_and_read_only_after_a_synchronize(events):
    timer = StepTimes(torch.device("cuda:0"), compiled=False)
    for _ in range(3):
        timer.begin()
        work()
        timer.middle()
        work()
        assert timer.end()
    assert [c["call"] for c in events.calls].count("synchronize") == 0  # nothing waited in the steps
    begin, middle, _ = timer._pending[0]
    with pytest.raises(RuntimeError, match="has not completed"):
        begin.elapsed_time(middle)  # what reading in a step would do: torch refuses it too
    forward_backward, optimizer, steps = timer.collect()
    assert steps == 3 and forward_backward > 0 and optimizer > 0
    assert [c["call"] for c in events.calls].count("synchronize") == 1
    assert timer.collect() == (0.0, 0.0, 0)
    # the events are used again: three per step, whatever the number of steps
    for _ in range(3):
        timer.begin()
        timer.middle()
        timer.end()
    timer.collect()
    assert [c["call"] for c in events.calls].count("Event") == 9


def test_a_step_that_compiled_is_left_out(events, monkeypatch):
    for device in ("cuda:0", "cpu"):
        counts = iter([0, 5, 5, 5])  # begin and end of two steps: compiled during the first only
        monkeypatch.setattr(step_time, "compile_count", lambda c=counts: next(c))
        timer = StepTimes(torch.device(device), compiled=True)
        timed = []
        for _ in range(2):
            timer.begin()
            timer.middle()
            timed.append(timer.end())
        assert timed == [False, True]
        assert timer.collect()[2] == 1, device
