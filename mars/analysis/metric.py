"""Which way a logged metric is better, and what it is called: decided here and nowhere else.

Any key of metrics.jsonl can be reported, plotted and summarized (--metric KEY). Whether lower or
higher values are better is read from the key's last part (before an lm-eval ",filter" suffix)
by the first matching rule of DIRECTION_RULES; a key no rule names is taken as loss-like (lower
is better), and --direction lower|higher overrides the rules for one command. A new metric
logged by the trainer therefore works in the report and the plots without code; add a rule here
only when its name should flip the default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from mars.errors import UserError

LOWER, HIGHER = "lower", "higher"

# (glob on the key's last part, better direction); the first match wins
DIRECTION_RULES: tuple[tuple[str, str], ...] = (
    ("acc*", HIGHER),  # acc, acc_norm, accuracy (downstream/TASK/acc_norm)
    ("exact_match*", HIGHER),
    ("f1", HIGHER),
    ("mcc", HIGHER),
    ("mfu", HIGHER),
    ("tokens_per_s", HIGHER),
    ("*loss*", LOWER),
    ("*perplexity*", LOWER),
    ("bits_per_byte", LOWER),
)
DEFAULT_DIRECTION = LOWER  # loss-like

TITLES = {"val/loss": "val loss", "val/loss_avg": "val loss (averaged weights)", "train/loss": "train loss"}
AXIS_LABELS = {
    "val/loss": "Validation loss",
    "val/loss_avg": "Validation loss of the averaged weights",
    "train/loss": "Training loss",
}
# logged at evaluations (few points): never smoothed
EVALUATION_PREFIXES = ("val/", "downstream/", "downstream_avg/")


@dataclass(frozen=True)
class Metric:
    """A metrics.jsonl key and the direction in which it is better."""

    key: str
    higher_is_better: bool = False
    why: str = "by name"  # how the direction was decided, for the report's header

    @property
    def title(self) -> str:
        return TITLES.get(self.key, self.key)

    @property
    def axis_label(self) -> str:
        return AXIS_LABELS.get(self.key, self.key)

    @property
    def direction(self) -> str:
        return HIGHER if self.higher_is_better else LOWER

    @property
    def is_evaluation(self) -> bool:
        return self.key.startswith(EVALUATION_PREFIXES)

    def reached(self, value: float, target: float) -> bool:
        """Whether a value is at the target or beyond it in the better direction."""
        return value >= target if self.higher_is_better else value <= target

    def best(self, values: Sequence[float]) -> float:
        """The best of the finite values (nan when there is none)."""
        finite = [v for v in values if math.isfinite(v)]
        if not finite:
            return math.nan
        return max(finite) if self.higher_is_better else min(finite)

    def better(self, difference: float) -> bool:
        """Whether a difference (group - baseline) is in the better direction."""
        return difference > 0 if self.higher_is_better else difference < 0


def direction_by_name(key: str) -> tuple[str, str]:
    """(direction, why) from DIRECTION_RULES."""
    name = key.rsplit("/", 1)[-1].split(",", 1)[0]
    for pattern, direction in DIRECTION_RULES:
        if fnmatchcase(name, pattern):
            return direction, f"by name: {pattern}"
    return DEFAULT_DIRECTION, "the default for a key no rule names"


def metric_of(key: str, direction: str | None = None) -> Metric:
    """The Metric of a key; `direction` ("lower" / "higher", from --direction) overrides the rules."""
    if not key or key != key.strip():
        raise UserError(f"--metric {key!r} is not a metrics.jsonl key (e.g. --metric val/loss)")
    if direction is None:
        direction, why = direction_by_name(key)
    elif direction in (LOWER, HIGHER):
        why = "--direction"
    else:
        raise UserError(f"--direction {direction!r} is neither {LOWER} nor {HIGHER}")
    return Metric(key, direction == HIGHER, why)
