"""Telling divergence from a benign gradient spike, so that the right checkpoint survives and a
preempted run always resumes.

Why. Now and then, most often early in training, one step's gradient norm jumps ten times or more
above its recent median while the loss keeps falling: the clip absorbs it and nothing follows. A
rule that raised an alarm on such a step alone marked the checkpoints saved after it unhealthy, and
a run preempted then could not be continued by `train.resume=auto`. Divergence looks different: the
norm becomes non-finite, the loss climbs, or the spikes keep coming.

The rule. An alarm is raised by
  * a non-finite gradient norm (the loop skips the step, counts it, and stops after
    train.max_nonfinite_steps in a row);
  * a logged train loss (the mean over the log window) `spike_loss` nats above the best logged so far;
  * a gradient-norm spike (above `spike_factor` times the median of the last HISTORY finite norms) that
    persists: PERSIST steps in a row above it. Once an alarm has been raised, every spike within
    `window` steps of the last alarm is an alarm too (the trouble goes on).
A lone spike raises no alarm: it stays pending for `window` steps. When an alarm follows within them,
the trouble is dated from the spike (`episode_start`): the trainer marks the checkpoints saved since
then unhealthy as well, and the stop advice names a checkpoint from before it. While a spike is
pending, checkpoint rotation keeps the newest checkpoint saved before it.

What it catches: a run that blows up (non-finite values), a loss that climbs `spike_loss` nats, and a
gradient norm that stays high (PERSIST steps in a row). What it lets pass: spikes after which the norm
is back near its median the next step or the one after, however large and however often they recur,
as long as the loss does not climb `spike_loss` nats; and a norm that grows slowly (the median
follows it). Both were chosen on the recorded runs of the README's CPU-scale study, all healthy: a
high-lr MARS run there had five spikes of 10-150x within 20 steps and trained on to a final val loss
0.1-0.15 nats from its other seeds', yet no run had more than two spike steps in a row, nor a logged
loss more than 0.5 nats above its best (docs/reliability.md#divergence-alarms has the figures).

Everything here works on host floats the loop reads at its read points anyway (the trainer's settle():
the gradient norms of the steps since the last one, in one transfer, fed here in step order; the loss
at log steps): no extra device synchronisation, and the same verdicts as per-step reads.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

HISTORY = 50  # recent finite gradient norms kept for the median
MIN_HISTORY = 10  # no spike verdicts before this many norms are known
PERSIST = 3  # spike steps in a row that make an alarm


class HealthMonitor:
    def __init__(self, window: int = 20, spike_factor: float = 10.0, spike_loss: float = 1.0):
        self.window = max(1, int(window))
        self.spike_factor = float(spike_factor)
        self.spike_loss = float(spike_loss)
        self.norms: deque[float] = deque(maxlen=HISTORY)
        self.best_loss = math.inf
        self.pending: list[int] = []  # steps of the spikes of the last `window` steps not yet an alarm
        self.in_a_row = 0  # spike steps in a row up to the last step
        self.last_alarm: int | None = None
        self.episode_start: int | None = None  # where the current trouble began (a spike or an alarm)

    def _alarm(self, step: int) -> None:
        began = min(self.pending, default=step)
        if self.last_alarm is None or began - self.last_alarm >= self.window:
            self.episode_start = began
        self.last_alarm = step
        self.pending.clear()

    def on_step(self, step: int, grad_norm: float) -> str | None:
        """After optimizer step `step` (1-based count of completed steps); returns an alarm message."""
        self.pending = [s for s in self.pending if step - s < self.window]
        if not math.isfinite(grad_norm):
            self._alarm(step)
            return None  # the loop counts non-finite steps and stops on a streak of them
        message = None
        if self.spike_factor > 0 and len(self.norms) >= MIN_HISTORY:
            median = statistics.median(self.norms)
            if median > 0 and grad_norm > self.spike_factor * median:
                message = self._spike(step, grad_norm, median)
            else:
                self.in_a_row = 0
        self.norms.append(grad_norm)
        return message

    def _spike(self, step: int, grad_norm: float, median: float) -> str | None:
        what = (
            f"gradient norm {grad_norm:.4g} is {grad_norm / median:.0f}x the median of the last "
            f"{len(self.norms)} steps"
        )
        self.in_a_row += 1
        if not self.healthy(step):
            self._alarm(step)
            return f"step {step}: {what}, within {self.window} steps of the last alarm"
        self.pending.append(step)
        if self.in_a_row < PERSIST:
            return None  # pending: an alarm within `window` steps dates its trouble from here
        self._alarm(step)
        return f"step {step}: {what}; {self.in_a_row} steps in a row above {self.spike_factor:g}x the median"

    def on_loss(self, step: int, loss: float) -> str | None:
        """At a log step, with the window's mean train loss."""
        if not math.isfinite(loss):
            return None
        message = None
        if self.spike_loss > 0 and loss > self.best_loss + self.spike_loss:
            self._alarm(step)
            message = f"step {step}: train loss {loss:.4f} is {loss - self.best_loss:.2f} nats above its best"
            if self.episode_start is not None and self.episode_start < step:
                message += f" (the trouble began at step {self.episode_start})"
        self.best_loss = min(self.best_loss, loss)
        return message

    def healthy(self, step: int) -> bool:
        """No alarm in the `window` steps up to and including `step`."""
        return self.last_alarm is None or step - self.last_alarm >= self.window

    def spike_pending(self) -> int | None:
        """The step of the oldest spike that an alarm within its window would still date the trouble from."""
        return min(self.pending, default=None)

    def state_dict(self) -> dict:
        return {
            "norms": list(self.norms),
            "best_loss": self.best_loss,
            "pending": list(self.pending),
            "in_a_row": self.in_a_row,
            "last_alarm": self.last_alarm,
            "episode_start": self.episode_start,
        }

    def load_state_dict(self, state: dict) -> None:
        self.norms = deque((float(n) for n in state.get("norms", [])), maxlen=HISTORY)
        self.best_loss = float(state.get("best_loss", math.inf))
        self.pending = [int(s) for s in state.get("pending", [])]
        self.in_a_row = int(state.get("in_a_row", 0))
        self.last_alarm = state.get("last_alarm")
        self.episode_start = state.get("episode_start")
