"""The learning-rate schedule the trainer drives every step (gamma's is its config's:
mars.optim.config.GammaScheduleConfig).

LRSchedule: learning-rate schedules as a multiplier on the optimizer's base learning rates.

The trainer applies `LRSchedule(step)` through mars.optim.set_lr_factor, which scales every
learning-rate-like entry (lr, lr_1d) from its initial value, so lr_1d / lr stays fixed as in
the reference. `step` is the 0-based index of the optimizer update about to be made, the reference
loop's `iter_num` (docs/algorithms.md section 6.5).
"""

from __future__ import annotations

import math

from mars.checks import choice, fraction, reported_as
from mars.errors import ConfigError
from mars.optim.config import decay_remaining

SCHEDULES = ("cosine", "linear", "wsd", "constant")


class LRSchedule:
    """Linear warmup over `warmup_steps`, then cosine | linear | wsd | constant down to `min_factor`.

    Warmup, as in the reference loop: factor step / warmup_steps for 0 <= step < warmup_steps, so
    step 0 runs at lr 0 (it still updates the optimizer's moments and buffers) and the peak is
    reached at step warmup_steps. The decay ends at `decay_steps` (and stays at min_factor after
    it). wsd (warmup-stable-decay) holds the peak until the last `decay_fraction` of decay_steps,
    then decays linearly.
    """

    def __init__(
        self,
        name: str,
        warmup_steps: int,
        decay_steps: int,
        min_factor: float = 0.0,
        decay_fraction: float = 0.2,
    ):
        with reported_as(ConfigError):
            choice("schedule.name", name, SCHEDULES)
            fraction("schedule.min_lr / optimizer.lr", min_factor, closed=True)
        self.name = name
        self.warmup_steps = int(warmup_steps)
        self.decay_steps = max(int(decay_steps), self.warmup_steps + 1)
        self.min_factor = float(min_factor)
        self.stable_end = _stable_end(self.warmup_steps, self.decay_steps, decay_fraction)

    @classmethod
    def from_config(cls, schedule_cfg, base_lr: float, max_steps: int) -> LRSchedule:
        return cls(
            name=schedule_cfg.name,
            warmup_steps=schedule_cfg.warmup_steps,
            decay_steps=_decay_steps(schedule_cfg, max_steps),
            min_factor=float(schedule_cfg.min_lr) / float(base_lr),
            decay_fraction=schedule_cfg.decay_fraction,
        )

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return step / self.warmup_steps
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
        return m + decay_remaining(self.name, progress) * (1.0 - m)


def _decay_steps(schedule_cfg, max_steps: int) -> int:
    """Where the decay ends: schedule.decay_steps, or train.max_steps when it is null."""
    return int(schedule_cfg.decay_steps if schedule_cfg.decay_steps is not None else max_steps)


def _stable_end(warmup_steps: int, decay_steps: int, decay_fraction: float) -> float:
    """wsd: where the peak ends and the decay begins (a float: the decay takes the last decay_fraction of
    the steps after warmup, wherever that falls)."""
    decay_steps = max(int(decay_steps), int(warmup_steps) + 1)
    return max(float(warmup_steps), decay_steps - decay_fraction * (decay_steps - warmup_steps))


def decay_start(max_steps: int, schedule_cfg) -> int:
    """The first step (0-based, as LRSchedule counts) whose lr may be below the peak of a run of
    `max_steps` steps: every step before it runs at the warmup's or the peak's lr, whatever max_steps is.

    wsd: the first step at or after the decay's start (its lr is the peak's when the start is a whole
    step, below it otherwise); cosine and linear: the end of warmup; constant: never (decay_steps).
    A wsd run of any length >= B agrees with a run of B steps on every step before decay_start(B): a
    checkpoint saved there (train.ckpt_steps) is where a cooldown branch of length B forks
    (train.fork_from, docs/training.md)."""
    name, warmup = schedule_cfg.name, int(schedule_cfg.warmup_steps)
    decay_steps = _decay_steps(schedule_cfg, max_steps)
    if name == "wsd":
        return math.ceil(_stable_end(warmup, decay_steps, float(schedule_cfg.decay_fraction)))
    if name == "constant":
        return max(decay_steps, warmup)
    return warmup
