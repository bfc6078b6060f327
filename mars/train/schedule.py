"""Learning-rate schedules as a multiplier on the optimizer's base learning rates.

The trainer applies `LRSchedule(step)` through mars.optim.set_lr_factor, which scales every
learning-rate-like entry (lr, lr_1d) from its initial value, so lr_1d / lr stays fixed as in
the reference. `step` is the 0-based index of the optimizer update about to be made.
"""

from __future__ import annotations

import math

from mars.train.config import SCHEDULES, ConfigError


class LRSchedule:
    """Linear warmup over `warmup_steps`, then cosine | linear | wsd | constant down to `min_factor`.

    The decay ends at `decay_steps` (and stays at min_factor after it). wsd (warmup-stable-decay)
    holds the peak until the last `decay_fraction` of decay_steps, then decays linearly.
    """

    def __init__(
        self,
        name: str,
        warmup_steps: int,
        decay_steps: int,
        min_factor: float = 0.0,
        decay_fraction: float = 0.2,
    ):
        if name not in SCHEDULES:
            raise ConfigError(f"schedule.name={name!r} is not one of {', '.join(SCHEDULES)}")
        if not 0.0 <= min_factor <= 1.0:
            raise ConfigError(f"schedule.min_lr / optimizer.lr = {min_factor} must lie in [0, 1]")
        self.name = name
        self.warmup_steps = int(warmup_steps)
        self.decay_steps = max(int(decay_steps), self.warmup_steps + 1)
        self.min_factor = float(min_factor)
        stable_end = self.decay_steps - decay_fraction * (self.decay_steps - self.warmup_steps)
        self.stable_end = max(float(self.warmup_steps), stable_end)

    @classmethod
    def from_config(cls, schedule_cfg, base_lr: float, max_steps: int) -> LRSchedule:
        decay_steps = schedule_cfg.decay_steps if schedule_cfg.decay_steps is not None else max_steps
        return cls(
            name=schedule_cfg.name,
            warmup_steps=schedule_cfg.warmup_steps,
            decay_steps=decay_steps,
            min_factor=float(schedule_cfg.min_lr) / float(base_lr),
            decay_fraction=schedule_cfg.decay_fraction,
        )

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.name == "constant":
            return 1.0
        m = self.min_factor
        if self.name == "wsd":
            if step < self.stable_end:
                return 1.0
            span = self.decay_steps - self.stable_end
            progress = min(1.0, (step - self.stable_end) / span) if span > 0 else 1.0
            return 1.0 - progress * (1.0 - m)
        progress = min(1.0, (step - self.warmup_steps) / (self.decay_steps - self.warmup_steps))
        if self.name == "linear":
            return 1.0 - progress * (1.0 - m)
        return m + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - m)  # cosine
