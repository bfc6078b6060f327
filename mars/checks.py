"""Config value checks, each one line naming the key as the user writes it: "KEY=VALUE must be ...".

Every check takes the key's full name and its value, and raises ValueError. A caller reports it as
its own error class with `reported_as` (train.py's ConfigError, the data layer's ConfigError,
eval's UserError); the model specs raise the ValueError itself. `get` reads a dotted key from a
dataclass, a mapping or an OmegaConf node alike.

    with reported_as(ConfigError):
        at_least("train.max_steps", get(cfg, "train.max_steps"), 1)
        choice("schedule.name", get(cfg, "schedule.name"), SCHEDULES)

Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any


def get(cfg: Any, dotted: str) -> Any:
    """cfg's value at `dotted` ("train.max_steps"), through dicts and attributes."""
    node = cfg
    for part in dotted.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def fail(key: str, value: Any, rule: str) -> None:
    """Raise the one line: KEY=VALUE RULE."""
    raise ValueError(f"{key}={value!r} {rule}")


def is_number(value: Any) -> bool:
    """An int or a float (not a bool, not None, not text)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def at_least(key: str, value: Any, minimum: float, what: str = "") -> None:
    """A number >= minimum (`what`: an explanation appended to the message)."""
    if not is_number(value) or not value >= minimum:
        fail(key, value, f"must be >= {minimum}{what}")


def above(key: str, value: Any, bound: float = 0, what: str = "") -> None:
    """A finite number > bound (inf is no size, no epsilon, no timeout)."""
    if is_number(value) and not math.isfinite(value):
        fail(key, value, f"must be a finite number > {bound}{what}")
    if not is_number(value) or not value > bound:
        fail(key, value, f"must be > {bound}{what}")


def at_most(key: str, value: Any, maximum: float, what: str = "") -> None:
    """A number <= maximum (so finite: inf and nan are refused)."""
    if not is_number(value) or not value <= maximum:
        fail(key, value, f"must be <= {maximum}{what}")


def finite_non_negative(key: str, value: Any) -> None:
    """A finite number >= 0 (learning rates, weight decay, gamma)."""
    if not is_number(value) or not math.isfinite(value) or value < 0:
        fail(key, value, "must be a finite number >= 0")


def fraction(key: str, value: Any, *, closed: bool = False) -> None:
    """A number in [0, 1) (dropout, momentum coefficients), or in [0, 1] when `closed`."""
    inside = is_number(value) and (0.0 <= value <= 1.0 if closed else 0.0 <= value < 1.0)
    if not inside:
        fail(key, value, f"must lie in [0, 1{']' if closed else ')'}")


def fraction_pair(key: str, value: Any) -> None:
    """A pair [beta1, beta2] of numbers in [0, 1) (Adam-style betas)."""
    if not (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(is_number(b) and 0.0 <= b < 1.0 for b in value)
    ):
        fail(key, value, "must be a pair [beta1, beta2] of numbers in [0, 1)")


def choice(key: str, value: Any, allowed: Iterable[str], what: str = "") -> None:
    """One of `allowed`."""
    allowed = tuple(allowed)
    if value not in allowed:
        fail(key, value, f"is not one of {', '.join(allowed)}{what}")


def flag(key: str, value: Any) -> None:
    """True or False (not 0, 1 or text)."""
    if not isinstance(value, bool):
        fail(key, value, "must be True or False")


def whole(key: str, value: Any, minimum: int = 1) -> None:
    """A whole number >= minimum (steps, counts): at_least, and an int."""
    at_least(key, value, minimum)
    if not isinstance(value, int):
        fail(key, value, "must be a whole number")


def multiple_of(key: str, value: int, of_key: str, of_value: int) -> None:
    """A multiple of another key's value (model.n_embd of model.n_head)."""
    if value % of_value:
        fail(key, value, f"must be a multiple of {of_key}={of_value}")


@contextmanager
def reported_as(error: type[Exception]) -> Iterator[None]:
    """Inside the block, a ValueError of a check leaves as `error` with the same one-line message."""
    try:
        yield
    except ValueError as e:
        if isinstance(e, error):
            raise
        raise error(str(e)) from None
