"""The `optimizer.*` keys: each optimizer's value checks, written once for its constructor and its config;
the reference code's names for them; the gamma schedule, its keys and its gamma_t.

An optimizer module declares its checks once (a tuple of `each(...)` rules of mars.checks and functions
relating keys) and both sides run them:

- the constructor, as a drop-in torch.optim optimizer, on its keywords and on every param group
  (mars.optim._contract): ValueError "OWNER: invalid KEY=VALUE: RULE";
- the config dataclass (`OptimizerConfig.validate`), when the config is composed, before the run dir:
  ValueError "optimizer.KEY=VALUE RULE (optimizer=NAME)".

A check looks only at the keys it is given (a param group holds no `approx`, MuonConfig no
`use_muon`), under the name each side uses for it (`names`: the matrix optimizers' groups keep
betas_1d and eps as the reference's adamw_betas and adamw_eps).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from mars import checks

GAMMA_SCHEDULES = ("constant", "linear", "cosine")

# A check: values -> the (key, value, rule) of each value it refuses.
Check = Callable[[Mapping[str, Any]], Iterator[tuple[str, Any, str]]]


def each(rule: Callable[..., None], *keys: str, args: tuple = ()) -> Check:
    """The check that applies a rule of mars.checks, rule(key, value, *args), to each of `keys`."""

    def check(values: Mapping[str, Any]) -> Iterator[tuple[str, Any, str]]:
        for key in keys:
            if key in values:
                try:
                    rule(key, values[key], *args)
                except ValueError as e:  # "KEY=VALUE RULE"
                    yield key, values[key], str(e).removeprefix(f"{key}={values[key]!r} ")

    return check


def problems(value_checks, values: Mapping[str, Any], names: Mapping[str, str] = MappingProxyType({})):
    """(key, value, rule) of each value that breaks one of `value_checks`. names: keyword -> the key
    `values` holds it under, which the result names too (a matrix optimizer's param groups keep
    betas_1d and eps as adamw_betas and adamw_eps)."""
    keyword = {name: key for key, name in names.items()}
    named = {keyword.get(key, key): value for key, value in values.items()}
    for check in value_checks:
        for key, value, rule in check(named):
            yield names.get(key, key), value, rule


def check_keywords(owner: str, value_checks, values: Mapping[str, Any], names=MappingProxyType({})) -> None:
    """The constructor's side: ValueError "OWNER: invalid KEY=VALUE: RULE" for the first refused value."""
    for key, value, rule in problems(value_checks, values, names):
        raise ValueError(f"{owner}: invalid {key}={value!r}: {rule}")


class OptimizerConfig:
    """Base of the optimizers' config dataclasses: `name`, then the `optimizer.*` keys, which are the
    constructor's keywords; `value_checks` (a class attribute, not a key) are the optimizer's checks."""

    name: str
    value_checks: tuple[Check, ...] = ()

    def validate(self, max_steps: int | None = None) -> None:
        """ValueError "optimizer.KEY=VALUE RULE (optimizer=NAME)" for the first value that cannot work
        (None, where the field takes it, means the optimizer's default); then the gamma schedule, whose
        decay ends at max_steps where it sets no decay_steps."""
        values = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) is not None or "None" not in str(f.type)
        }
        for key, value, rule in problems(self.value_checks, values):
            raise ValueError(f"optimizer.{key}={value!r} {rule} (optimizer={self.name})")
        schedule = getattr(self, "gamma_schedule", None)
        if schedule is not None:
            schedule.validate(max_steps)

    @classmethod
    def keys(cls) -> list[str]:
        """The optimizer.* keys this optimizer takes (its fields)."""
        return [f.name for f in fields(cls)]


def decay_remaining(shape: str, progress: float) -> float:
    """How much of the way from a decay's end value back to its peak remains at `progress` in [0, 1]
    (`linear` or `cosine`): the gamma schedule's and the lr schedule's (mars.train.schedule) one shape."""
    if shape == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine


@dataclass
class GammaScheduleConfig:
    """optimizer.gamma_schedule: gamma_t for the MARS family (docs/algorithms.md section 7), which the
    trainer sets before every step (mars.optim.set_gamma).

    Linear warmup from `start` (step 0) to the peak, optimizer.gamma (step warmup_steps), then `constant`
    at the peak, or a `linear` / `cosine` decay to `end`, reached at `decay_steps` (null: train.max_steps)
    and kept after it. Values are absolute: gamma_t is what the optimizer uses at step t."""

    name: str = "constant"  # constant | linear | cosine
    warmup_steps: int = 0
    start: float = 0.0
    end: float = 0.0
    decay_steps: int | None = None

    def gamma(self, step: int, peak: float, max_steps: int) -> float:
        """gamma_t of update `step` (0-based) of a run of max_steps steps whose peak is `peak`."""
        if step < self.warmup_steps:
            return self.start + (peak - self.start) * step / self.warmup_steps
        if self.name == "constant":
            return peak
        decay_steps = self.decay_steps if self.decay_steps is not None else max_steps
        progress = min(1.0, (step - self.warmup_steps) / (decay_steps - self.warmup_steps))
        return self.end + decay_remaining(self.name, progress) * (peak - self.end)

    def validate(self, max_steps: int | None = None) -> None:
        """The schedule's values, and that its decay ends after its warmup (at decay_steps, or at
        max_steps where decay_steps is null and max_steps is given). The peak, optimizer.gamma, is the
        optimizer's value (its value_checks)."""
        checks.choice("optimizer.gamma_schedule.name", self.name, GAMMA_SCHEDULES)
        for key in ("start", "end"):
            checks.finite_non_negative(f"optimizer.gamma_schedule.{key}", getattr(self, key))
        checks.at_least("optimizer.gamma_schedule.warmup_steps", self.warmup_steps, 0)
        if self.name == "constant":
            return
        if self.decay_steps is not None and self.decay_steps <= self.warmup_steps:
            raise ValueError(
                f"optimizer.gamma_schedule ends before it starts: decay_steps={self.decay_steps} is not "
                f"after warmup_steps={self.warmup_steps}; raise decay_steps (null: train.max_steps) or "
                "lower warmup_steps"
            )
        if self.decay_steps is None and max_steps is not None and max_steps <= self.warmup_steps:
            raise ValueError(
                "optimizer.gamma_schedule ends before it starts: its decay ends at train.max_steps="
                f"{max_steps}, not after warmup_steps={self.warmup_steps}; set decay_steps or lower "
                "warmup_steps"
            )


# The MARS reference code's keyword names -> this package's, which are the `optimizer.*` config keys.
REFERENCE_NAMES = MappingProxyType(
    {
        "wd": "weight_decay",
        "is_approx": "approx",
        "adamw_lr": "lr_1d",
        "adamw_betas": "betas_1d",
        "adamw_eps": "eps",
        "adamw_wd": "weight_decay_1d",
    }
)


def reference_names(init: Callable) -> Callable:
    """Decorate an optimizer's __init__ so that it also takes the reference's keyword names (and its
    refusals name a value as the caller did: "invalid is_approx='yes'")."""

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        given = {}  # this package's name -> the reference name the caller used
        for old, new in REFERENCE_NAMES.items():
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(
                        f"{type(self).__name__}() got both {new}= and its reference name {old}=; pass one"
                    )
                kwargs[new] = kwargs.pop(old)
                given[new] = old
        try:
            return init(self, *args, **kwargs)
        except ValueError as err:
            message = str(err)
            for new, old in given.items():
                message = message.replace(f"invalid {new}=", f"invalid {old}=")
            err.args = (message,)
            raise

    return wrapper
