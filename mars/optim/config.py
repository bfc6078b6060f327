"""Config pieces shared by the optimizers' configs: the gamma schedule, and value checks.

Each optimizer's config dataclass lives in its own module next to the class and is registered in
mars.optim.registry; its fields are exactly the `optimizer.*` keys it takes, so a key the chosen
optimizer does not use is refused when Hydra composes the config. `validate()` checks the values
(ValueError naming the key, the value and the rule) before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from mars import checks

GAMMA_SCHEDULES = ("constant", "linear", "cosine")


class ConfigChecks:
    """Value checks for a config dataclass with a `name`: each raises one ValueError naming the key as
    optimizer.KEY and the optimizer (the rules are mars.checks', shared with every other config)."""

    name: str

    def _fail(self, key: str, rule: str) -> None:
        """A rule between keys that no single check states: optimizer.KEY=VALUE RULE (optimizer=NAME)."""
        self._check(checks.fail, key, rule)

    def _check(self, check, key: str, *args) -> None:
        try:
            check(f"optimizer.{key}", getattr(self, key), *args)
        except ValueError as e:
            raise ValueError(f"{e} (optimizer={self.name})") from None

    def _non_negative(self, *keys: str) -> None:
        for key in keys:
            self._check(checks.finite_non_negative, key)

    def _fraction(self, *keys: str) -> None:
        """Momentum coefficients: a number in [0, 1)."""
        for key in keys:
            self._check(checks.fraction, key)

    def _pair_of_fractions(self, *keys: str) -> None:
        for key in keys:
            self._check(checks.fraction_pair, key)

    def _at_least_one(self, *keys: str) -> None:
        for key in keys:
            self._check(checks.at_least, key, 1)

    def _choice(self, key: str, choices: tuple[str, ...]) -> None:
        self._check(checks.choice, key, choices)

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
        checks.choice("optimizer.gamma_schedule.name", self.name, GAMMA_SCHEDULES)
        for key in ("start", "end"):
            checks.finite_non_negative(f"optimizer.gamma_schedule.{key}", getattr(self, key))
        checks.finite_non_negative("optimizer.gamma", peak)
        checks.at_least("optimizer.gamma_schedule.warmup_steps", self.warmup_steps, 0)
        if self.name != "constant" and self.decay_steps is not None and self.decay_steps <= self.warmup_steps:
            raise ValueError(
                f"optimizer.gamma_schedule ends before it starts: decay_steps={self.decay_steps} is not "
                f"after warmup_steps={self.warmup_steps}; raise decay_steps (null: train.max_steps) or "
                "lower warmup_steps"
            )
