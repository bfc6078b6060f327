"""Config pieces shared by the optimizers' configs: the gamma schedule, and value checks.

Each optimizer's config dataclass lives in its own module next to the class and is registered in
mars.optim.registry; its fields are exactly the `optimizer.*` keys it takes, so a key the chosen
optimizer does not use is refused when Hydra composes the config. `validate()` checks the values
(ValueError naming the key, the value and the rule) before anything is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

GAMMA_SCHEDULES = ("constant", "linear", "cosine")


class ConfigChecks:
    """Value checks for a config dataclass with a `name`: each raises one ValueError naming the key."""

    name: str

    def _fail(self, key: str, rule: str) -> None:
        raise ValueError(f"optimizer.{key}={getattr(self, key)!r} {rule} (optimizer={self.name})")

    def _non_negative(self, *keys: str) -> None:
        for key in keys:
            value = getattr(self, key)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                self._fail(key, "must be a finite number >= 0")

    def _fraction(self, *keys: str) -> None:
        """Momentum coefficients: a number in [0, 1)."""
        for key in keys:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                self._fail(key, "must be a number in [0, 1)")

    def _pair_of_fractions(self, *keys: str) -> None:
        for key in keys:
            value = getattr(self, key)
            if len(value) != 2 or not all(
                isinstance(b, (int, float)) and not isinstance(b, bool) and 0.0 <= b < 1.0 for b in value
            ):
                self._fail(key, "must be a pair [beta1, beta2] of numbers in [0, 1)")

    def _at_least_one(self, *keys: str) -> None:
        for key in keys:
            if getattr(self, key) < 1:
                self._fail(key, "must be >= 1")

    def _choice(self, key: str, choices: tuple[str, ...]) -> None:
        if getattr(self, key) not in choices:
            self._fail(key, f"must be one of {', '.join(choices)}")

    @classmethod
    def keys(cls) -> list[str]:
        """The optimizer.* keys this optimizer takes (its fields)."""
        return [f.name for f in fields(cls)]


@dataclass
class GammaScheduleConfig:
    """optimizer.gamma_schedule: gamma_t for the MARS family (docs/algorithms.md section 7).

    Linear warmup from `start` (step 0) to optimizer.gamma (step warmup_steps), then `constant`, or a
    `linear` / `cosine` decay to `end` at `decay_steps` (null: train.max_steps). Values are absolute."""

    name: str = "constant"  # constant | linear | cosine
    warmup_steps: int = 0
    start: float = 0.0
    end: float = 0.0
    decay_steps: int | None = None

    def validate(self, peak: float) -> None:
        if self.name not in GAMMA_SCHEDULES:
            raise ValueError(
                f"optimizer.gamma_schedule.name={self.name!r} must be one of {', '.join(GAMMA_SCHEDULES)}"
            )
        for key in ("start", "end"):
            value = getattr(self, key)
            if not math.isfinite(float(value)) or value < 0:
                raise ValueError(f"optimizer.gamma_schedule.{key}={value} must be a number >= 0")
        if not math.isfinite(float(peak)) or peak < 0:
            raise ValueError(f"optimizer.gamma={peak} must be a number >= 0")
        if self.warmup_steps < 0:
            raise ValueError(f"optimizer.gamma_schedule.warmup_steps={self.warmup_steps} must be >= 0")
        if self.name != "constant" and self.decay_steps is not None and self.decay_steps <= self.warmup_steps:
            raise ValueError(
                f"optimizer.gamma_schedule ends before it starts: decay_steps={self.decay_steps} is not "
                f"after warmup_steps={self.warmup_steps}; raise decay_steps (null: train.max_steps) or "
                "lower warmup_steps"
            )
