"""Telling healthy training from the start of a divergence, so the right checkpoint survives.

A step raises an alarm when its gradient norm is not finite, or is `spike_factor` times the median
of the recent finite norms, or when the logged (windowed) train loss rises `spike_loss` nats above
the best logged so far. A checkpoint is healthy when no alarm fell in the `window` steps up to it;
checkpoint rotation never deletes the newest healthy checkpoint, and when a run diverges the advice
names the newest healthy checkpoint saved before the current run of alarms began.

Everything here works on host floats the loop already has (the grad norm is read every step, the
loss at log steps): no extra device synchronisation.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

HISTORY = 50  # recent finite gradient norms kept for the median
MIN_HISTORY = 10  # no spike verdicts before this many norms are known


class HealthMonitor:
    def __init__(self, window: int = 20, spike_factor: float = 10.0, spike_loss: float = 1.0):
        self.window = max(1, int(window))
        self.spike_factor = float(spike_factor)
        self.spike_loss = float(spike_loss)
        self.norms: deque[float] = deque(maxlen=HISTORY)
        self.best_loss = math.inf
        self.last_alarm: int | None = None
        self.episode_start: int | None = None  # first alarm of the current run of alarms

    def _alarm(self, step: int) -> None:
        if self.last_alarm is None or step - self.last_alarm > self.window:
            self.episode_start = step
        self.last_alarm = step

    def on_step(self, step: int, grad_norm: float) -> str | None:
        """After optimizer step `step` (1-based count of completed steps); returns an alarm message."""
        if not math.isfinite(grad_norm):
            self._alarm(step)
            return None  # the loop reports non-finite steps itself
        message = None
        if self.spike_factor > 0 and len(self.norms) >= MIN_HISTORY:
            median = statistics.median(self.norms)
            if median > 0 and grad_norm > self.spike_factor * median:
                self._alarm(step)
                message = (
                    f"step {step}: gradient norm {grad_norm:.4g} is {grad_norm / median:.0f}x the median of "
                    f"the last {len(self.norms)} steps"
                )
        self.norms.append(grad_norm)
        return message

    def on_loss(self, step: int, loss: float) -> str | None:
        """At a log step, with the window's mean train loss."""
        if not math.isfinite(loss):
            return None
        message = None
        if self.spike_loss > 0 and loss > self.best_loss + self.spike_loss:
            self._alarm(step)
            message = f"step {step}: train loss {loss:.4f} is {loss - self.best_loss:.2f} nats above its best"
        self.best_loss = min(self.best_loss, loss)
        return message

    def healthy(self, step: int) -> bool:
        """No alarm in the `window` steps up to and including `step`."""
        return self.last_alarm is None or step - self.last_alarm >= self.window

    def state_dict(self) -> dict:
        return {
            "norms": list(self.norms),
            "best_loss": self.best_loss,
            "last_alarm": self.last_alarm,
            "episode_start": self.episode_start,
        }

    def load_state_dict(self, state: dict) -> None:
        self.norms = deque((float(n) for n in state.get("norms", [])), maxlen=HISTORY)
        self.best_loss = float(state.get("best_loss", math.inf))
        self.last_alarm = state.get("last_alarm")
        self.episode_start = state.get("episode_start")
