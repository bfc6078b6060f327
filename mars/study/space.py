"""A search space: each searched training key and the distribution it is drawn from.

In the spec, an arm's `search` is a nested mapping of training keys whose leaves are distributions:

    search:
      optimizer:
        lr: {dist: loguniform, lo: 1.0e-4, hi: 3.0e-2}
        gamma: {dist: uniform, lo: 0.0, hi: 0.2}
      schedule:
        warmup_steps: {dist: int, lo: 10, hi: 80}
      train:
        grad_clip: {dist: choice, choices: [0.5, 1.0, 0]}

dist: `loguniform` and `uniform` [lo, hi] (floats), `int` and `logint` [lo, hi] (integers, both bounds
included), `choice` (one of `choices`). Each becomes an optuna distribution; `widen` is what
auto_extend does at a bound: one octave (x2) in log space, half the width on a linear range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from mars.analysis.edges import Range
from mars.study.errors import StudyError

DISTS = ("loguniform", "uniform", "int", "logint", "choice")
_FIELDS = {"dist", "lo", "hi", "choices"}


@dataclass(frozen=True)
class Dist:
    """One searched key's distribution (`where`: its spec path, for messages)."""

    key: str  # the training key, e.g. optimizer.lr
    kind: str
    lo: float | int | None = None
    hi: float | int | None = None
    choices: tuple = ()
    where: str = ""

    @property
    def log(self) -> bool:
        return self.kind in ("loguniform", "logint")

    @property
    def numeric(self) -> bool:
        return self.kind != "choice"

    def distribution(self):
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind in ("loguniform", "uniform"):
            return FloatDistribution(float(self.lo), float(self.hi), log=self.log)
        if self.kind in ("int", "logint"):
            return IntDistribution(int(self.lo), int(self.hi), log=self.log)
        return CategoricalDistribution([_hashable(c) for c in self.choices])

    def range(self) -> Range | None:
        return Range(float(self.lo), float(self.hi), self.log) if self.numeric else None

    def widen(self, bound: str) -> Dist:
        """The range one step wider at `bound` ("lower" / "upper"): one octave for a log range, half its
        width for a linear one (integers rounded outwards)."""
        lo, hi = float(self.lo), float(self.hi)
        if self.log:
            lo, hi = (lo / 2, hi) if bound == "lower" else (lo, hi * 2)
        else:
            step = (hi - lo) / 2
            lo, hi = (lo - step, hi) if bound == "lower" else (lo, hi + step)
        if self.kind in ("int", "logint"):
            lo, hi = math.floor(lo), math.ceil(hi)
            if self.kind == "logint":
                lo = max(lo, 1)
        return Dist(self.key, self.kind, lo, hi, self.choices, self.where)

    def slab(self, old: Dist, bound: str) -> Dist:
        """The part of this (widened) range beyond `old`'s bound: where an extension round samples."""
        if bound == "lower":
            return Dist(self.key, self.kind, self.lo, old.lo, self.choices, self.where)
        return Dist(self.key, self.kind, old.hi, self.hi, self.choices, self.where)

    def describe(self) -> str:
        if self.kind == "choice":
            return f"{self.key} in {list(self.choices)}"
        return f"{self.key} {self.kind} [{self.lo:g}, {self.hi:g}]"


def _hashable(value: Any) -> Any:
    """optuna's categorical choices must be None, bool, int, float or str: lists go as their YAML text."""
    if isinstance(value, (list, tuple)):
        from mars.entry import hydra_value

        return hydra_value(list(value))
    return value


def choice_value(text: Any) -> Any:
    """A categorical value back as the training key takes it (a list given as its text)."""
    if isinstance(text, str) and text.startswith("["):
        import yaml

        return yaml.safe_load(text)
    return text


def _is_leaf(node: Any) -> bool:
    return isinstance(node, dict) and "dist" in node


def flatten_search(search: dict, where: str) -> dict[str, dict]:
    """{"optimizer": {"lr": {dist...}}} -> {"optimizer.lr": {dist...}}; StudyError for a node that is
    neither a distribution nor a mapping of them."""
    out: dict[str, dict] = {}

    def walk(node: Any, prefix: str) -> None:
        if _is_leaf(node):
            out[prefix] = node
            return
        if not isinstance(node, dict) or not node:
            raise StudyError(
                f"{where}.{prefix}: expected a distribution {{dist: {'|'.join(DISTS)}, lo, hi}} "
                "(or choices), "
                f"or a mapping of keys to distributions, got {node!r}"
            )
        for k, v in node.items():
            walk(v, f"{prefix}.{k}" if prefix else str(k))

    walk(search, "")
    return out


def parse_dist(key: str, node: dict, where: str) -> Dist:
    """One distribution from its spec mapping, every bad value a StudyError naming `where.key`."""
    at = f"{where}.{key}"
    unknown = sorted(set(node) - _FIELDS)
    if unknown:
        raise StudyError(
            f"{at}: unknown field(s) {', '.join(unknown)}; a distribution has dist, lo, hi, choices"
        )
    kind = node.get("dist")
    if kind not in DISTS:
        raise StudyError(f"{at}.dist={kind!r} is not one of {', '.join(DISTS)}")
    if kind == "choice":
        choices = node.get("choices")
        if node.get("lo") is not None or node.get("hi") is not None:
            raise StudyError(f"{at}: dist=choice takes choices, not lo/hi")
        if not isinstance(choices, (list, tuple)) or not choices:
            raise StudyError(f"{at}.choices must be a non-empty list (e.g. choices: [0.9, 0.95])")
        if len({repr(c) for c in choices}) < len(choices):
            raise StudyError(f"{at}.choices={list(choices)} repeats a value")
        return Dist(key, kind, choices=tuple(choices), where=at)
    if node.get("choices") is not None:
        raise StudyError(f"{at}: dist={kind} takes lo and hi, not choices (or use dist: choice)")
    lo, hi = node.get("lo"), node.get("hi")
    for name, v in (("lo", lo), ("hi", hi)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise StudyError(f"{at}.{name}={v!r} must be a finite number")
        if kind in ("int", "logint") and float(v) != int(v):
            raise StudyError(f"{at}.{name}={v!r} must be an integer for dist={kind}")
    if lo > hi:
        raise StudyError(f"{at}: lo={lo:g} > hi={hi:g}; swap them")
    if lo == hi:
        raise StudyError(
            f"{at}: lo = hi = {lo:g} searches nothing; fix the key in the arm's overrides instead"
        )
    if kind in ("loguniform", "logint") and lo <= 0:
        raise StudyError(
            f"{at}: dist={kind} needs lo > 0 (got lo={lo:g}): a log range cannot reach 0; use dist=uniform, "
            "or a positive lo"
        )
    if kind in ("int", "logint"):
        lo, hi = int(lo), int(hi)
    else:
        lo, hi = float(lo), float(hi)
    return Dist(key, kind, lo, hi, where=at)


def parse_space(search: dict, where: str) -> dict[str, Dist]:
    return {key: parse_dist(key, node, where) for key, node in flatten_search(search, where).items()}


def distributions(space: dict[str, Dist]) -> dict:
    return {key: d.distribution() for key, d in space.items()}


def draw(trial, space: dict[str, Dist]) -> dict:
    """Each key's value for an optuna trial, through its public suggest API (the study's sampler draws
    them; a value the trial already holds is kept)."""
    out = {}
    for key, d in space.items():
        if d.kind in ("loguniform", "uniform"):
            out[key] = trial.suggest_float(key, float(d.lo), float(d.hi), log=d.log)
        elif d.kind in ("int", "logint"):
            out[key] = trial.suggest_int(key, int(d.lo), int(d.hi), log=d.log)
        else:
            out[key] = trial.suggest_categorical(key, [_hashable(c) for c in d.choices])
    return out
