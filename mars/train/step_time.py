"""Where a training step's time goes: forward-backward (the micro-batches' forward and backward passes and
the gradient clip; exact MARS's look-ahead pass included) and the optimizer step (the update, the
averaged weights' update and zeroing the gradients), without reading anything from the device in a step.

    CPU   time.perf_counter() at the start, between the two parts and at the end: the CPU's work is done
          when a call returns, so each part is its wall time, and the two add up to the step's.
    CUDA  three torch.cuda.Events per step, recorded on the current stream at the same places (queued
          with the work: nothing waits); their elapsed times are read at the next read point
          (Trainer.settle, where the host reads the device anyway), after a torch.cuda.synchronize
          (every event recorded has completed): each part's time on the GPU.

A step during which torch.compile compiled anything (the first steps of a compiled run, a recompile,
the backward graph compiled at the first backward) is left out of every time: that is compilation, not
training. The trainer logs the means over the steps of a log line (ms_forward_backward, ms_optimizer)
next to ms_per_step, the wall time of the same steps.
"""

from __future__ import annotations

import time

import torch


def compile_count() -> int:
    """How much torch.compile has compiled in this process so far (frames traced, and every compilation
    phase timed: a backward graph is compiled at the first backward, apart from its forward)."""
    from torch._dynamo import utils

    return utils.counters["frames"]["total"] + sum(len(v) for v in utils.compilation_time_metrics.values())


class StepTimes:
    """The split of the steps since the last `collect()`: begin(), middle() and end() mark each step."""

    def __init__(self, device: torch.device, compiled: bool):
        self.device = device
        self.cuda = device.type == "cuda"
        self.compiled = compiled
        self._count = 0
        self._marks: list = []
        self._pending: list[tuple] = []  # CUDA: the events of the timed steps not read yet
        self._free: list = []  # CUDA: events read, to record again
        self._sums = [0.0, 0.0, 0]  # CPU: forward-backward seconds, optimizer seconds, steps

    def _mark(self):
        if not self.cuda:
            return time.perf_counter()
        event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def begin(self) -> None:
        if self.compiled:
            self._count = compile_count()
        self._marks = [self._mark()]

    def middle(self) -> None:
        self._marks.append(self._mark())

    def end(self) -> bool:
        """The step is done (on the host); returns whether it is timed (it compiled nothing)."""
        self._marks.append(self._mark())
        timed = not (self.compiled and compile_count() != self._count)
        begin, middle, end = self._marks
        if self.cuda:
            if timed:
                self._pending.append((begin, middle, end))
            else:
                self._free += [begin, middle, end]
        elif timed:
            self._sums[0] += middle - begin
            self._sums[1] += end - middle
            self._sums[2] += 1
        return timed

    def collect(self) -> tuple[float, float, int]:
        """(forward-backward seconds, optimizer seconds, steps) of the timed steps since the last collect.
        CUDA: waits for the device first (call it at read points only)."""
        if self.cuda and self._pending:
            torch.cuda.synchronize(self.device)
            for begin, middle, end in self._pending:
                self._sums[0] += begin.elapsed_time(middle) / 1000
                self._sums[1] += middle.elapsed_time(end) / 1000
                self._sums[2] += 1
                self._free += [begin, middle, end]
            self._pending = []
        out = (self._sums[0], self._sums[1], int(self._sums[2]))
        self._sums = [0.0, 0.0, 0]
        return out
