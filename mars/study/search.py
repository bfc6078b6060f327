"""How an arm searches: its space, the sampler that draws from it, the edge rule and auto_extend's
wider rounds, the finals that rerun its best configs, and the records of its trials.

A search space: each searched training key and the distribution it is drawn from.

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
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.samplers import BaseSampler, QMCSampler, RandomSampler, TPESampler

from mars.analysis.edges import Edge, Range, find_edges
from mars.errors import UserError

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
    """{"optimizer": {"lr": {dist...}}} -> {"optimizer.lr": {dist...}}; UserError for a node that is
    neither a distribution nor a mapping of them."""
    out: dict[str, dict] = {}

    def walk(node: Any, prefix: str) -> None:
        if _is_leaf(node):
            out[prefix] = node
            return
        if not isinstance(node, dict) or not node:
            raise UserError(
                f"{where}.{prefix}: expected a distribution {{dist: {'|'.join(DISTS)}, lo, hi}} "
                "(or choices), "
                f"or a mapping of keys to distributions, got {node!r}"
            )
        for k, v in node.items():
            walk(v, f"{prefix}.{k}" if prefix else str(k))

    walk(search, "")
    return out


def parse_dist(key: str, node: dict, where: str) -> Dist:
    """One distribution from its spec mapping, every bad value a UserError naming `where.key`."""
    at = f"{where}.{key}"
    unknown = sorted(set(node) - _FIELDS)
    if unknown:
        raise UserError(
            f"{at}: unknown field(s) {', '.join(unknown)}; a distribution has dist, lo, hi, choices"
        )
    kind = node.get("dist")
    if kind not in DISTS:
        raise UserError(f"{at}.dist={kind!r} is not one of {', '.join(DISTS)}")
    if kind == "choice":
        choices = node.get("choices")
        if node.get("lo") is not None or node.get("hi") is not None:
            raise UserError(f"{at}: dist=choice takes choices, not lo/hi")
        if not isinstance(choices, (list, tuple)) or not choices:
            raise UserError(f"{at}.choices must be a non-empty list (e.g. choices: [0.9, 0.95])")
        if len({repr(c) for c in choices}) < len(choices):
            raise UserError(f"{at}.choices={list(choices)} repeats a value")
        return Dist(key, kind, choices=tuple(choices), where=at)
    if node.get("choices") is not None:
        raise UserError(f"{at}: dist={kind} takes lo and hi, not choices (or use dist: choice)")
    lo, hi = node.get("lo"), node.get("hi")
    for name, v in (("lo", lo), ("hi", hi)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise UserError(f"{at}.{name}={v!r} must be a finite number")
        if kind in ("int", "logint") and float(v) != int(v):
            raise UserError(f"{at}.{name}={v!r} must be an integer for dist={kind}")
    if lo > hi:
        raise UserError(f"{at}: lo={lo:g} > hi={hi:g}; swap them")
    if lo == hi:
        raise UserError(
            f"{at}: lo = hi = {lo:g} searches nothing; fix the key in the arm's overrides instead"
        )
    if kind in ("loguniform", "logint") and lo <= 0:
        raise UserError(
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


# --------------------------------------------------------------------------------------------------
# The samplers, built so that a trial's parameters depend only on the sampler's seed and the trial's
# number in its optuna study (and, for TPE, on the results it is shown): a study interrupted and
# resumed, or run by several drivers, draws exactly the trials one uninterrupted driver draws.
#
# * sobol: optuna's QMCSampler, scrambled Sobol' (as AlgoPerf's quasi-random search). Its search space
#   is the arm's from the first trial on (optuna's would draw the first trial at random), and trial N
#   takes point N of the sequence (optuna's counts draws in a study attribute, which two drivers asking
#   at once could read alike).
# * random: optuna's RandomSampler, seeded per trial with (seed, N).
# * tpe: optuna's TPESampler (multivariate, constant liar for trials still running), seeded per trial
#   with (seed, N); it models the results present when trial N is asked, so with several trials at a
#   time its draws depend on which had finished.


def _quietly(make):
    """Build a sampler without optuna's ExperimentalWarning (QMC, multivariate TPE and its constant liar
    are marked experimental; the behaviour used here is pinned by tests/study)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return make()


def trial_seed(seed: int, number: int) -> int:
    return int(np.random.SeedSequence([int(seed), int(number)]).generate_state(1)[0])


class SobolSampler(QMCSampler):
    """Scrambled Sobol' over a fixed search space; trial N takes the sequence's point N."""

    def __init__(self, space: dict, seed: int):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            super().__init__(qmc_type="sobol", scramble=True, seed=seed, warn_independent_sampling=False)
        self._space = dict(space)
        self._number = 0

    def infer_relative_search_space(self, study, trial) -> dict:
        return dict(self._space)

    def sample_relative(self, study, trial, search_space):
        self._number = trial.number
        with warnings.catch_warnings():  # scipy: Sobol' balance needs 2^m points (any count works)
            warnings.simplefilter("ignore", UserWarning)
            return super().sample_relative(study, trial, search_space)

    def _find_sample_id(
        self, study, search_space
    ) -> int:  # optuna's counts draws; ours is the trial's number
        return self._number


class PerTrialSeeded(BaseSampler):
    """Another sampler, built afresh for each trial with the seed (seed, trial number)."""

    def __init__(self, make, seed: int):
        self._make, self._seed = make, seed
        self._inner: BaseSampler = _quietly(lambda: make(seed))

    def before_trial(self, study, trial) -> None:
        self._inner = _quietly(lambda: self._make(trial_seed(self._seed, trial.number)))
        self._inner.before_trial(study, trial)

    def infer_relative_search_space(self, study, trial):
        return self._inner.infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        return self._inner.sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._inner.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study, trial, state, values) -> None:
        self._inner.after_trial(study, trial, state, values)


def make_sampler(name: str, seed: int, space: dict, startup_trials: int | None = None) -> BaseSampler:
    """The sampler `study.sampler.name` names, over `space` (name -> optuna distribution)."""
    if name == "sobol":
        return SobolSampler(space, seed)
    if name == "random":
        return PerTrialSeeded(lambda s: RandomSampler(seed=s), seed)
    if name == "tpe":
        extra = {} if startup_trials is None else {"n_startup_trials": int(startup_trials)}
        return PerTrialSeeded(
            lambda s: TPESampler(seed=s, multivariate=True, constant_liar=True, **extra), seed
        )
    raise ValueError(f"unknown sampler {name!r}")


# --------------------------------------------------------------------------------------------------
# Edges after an arm's search, and auto_extend: widening the range where the best sits at a bound.
#
# After each search round of an arm, the edge rule (mars.analysis.edges: the best trial is bracketed
# on each side of each numeric key by a trial worse than it by more than study.edges.tolerance) runs on
# all of the arm's finished trials so far, in the current range of each key. Each edge is one line
# naming the arm, the key and the side. With study.auto_extend.rounds > 0, an arm with
# edges gets another round of study.auto_extend.trials trials:
#
# * each key at an edge is widened there (mars.study.search.Dist.widen: one octave on a log range, half
#   the width on a linear one), unless the train config refuses the new bound (gamma below 0, an lr
#   below schedule.min_lr): then the edge stays, and the report says that the config holds it there
#   (a constrained optimum, such as gamma = 0, or a setting to change);
# * the round samples only what is new: each widened key over its new part (the slab beyond the old
#   bound; the corner, when two keys widen), every other key over its whole current range;
# * its trials count against the arm's budget, which the report shows per round.
#
# An edge left when the rounds are spent marks the arm's comparison "not at the optimum".


@dataclass(frozen=True)
class Round:
    """One search round of an arm: its full space after widening, the space it samples, its budget."""

    number: int
    space: dict[str, Dist]  # the arm's range after this round's widening (edges are judged in it)
    sample: dict[str, Dist]  # what this round draws from
    trials: int
    offset: int  # the arm's trial index of this round's first trial (its run dir's number)
    notes: tuple[str, ...] = ()  # why it exists (the edges it widens)


def points_of(search) -> list[tuple[dict, float]]:
    """(params, value) of an arm's finished search trials (TrialRecords): what the edge rule judges."""
    return [(t.params, t.value) for t in search if t.state == "COMPLETE"]


def edges_of(space: dict[str, Dist], points, higher_is_better: bool, tolerance: float, arm: str):
    ranges = {k: d.range() for k, d in space.items() if d.numeric}
    return find_edges(points, ranges, higher_is_better, tolerance, arm)


def widen(
    current: Round, edges: list[Edge], trials: int, refuse
) -> tuple[Round | None, list[tuple[Edge, str]]]:
    """The next round for these edges, and the edges that cannot widen with the reason (the train config
    refuses the new bound: `refuse(key, value)` returns its one line or None)."""
    space, sample = dict(current.space), dict(current.space)
    limits: list[tuple[Edge, str]] = []
    notes = []
    for edge in edges:
        old = space[edge.key]
        new = old.widen(edge.bound)
        bound = new.lo if edge.bound == "lower" else new.hi
        reason = refuse(edge.key, bound)
        if reason is not None:
            limits.append((edge, reason))
            continue
        space[edge.key] = new
        sample[edge.key] = new.slab(old, edge.bound)
        notes.append(f"{edge.line()} -> widened to {new.describe()}")
    if not notes:
        return None, limits
    nxt = Round(current.number + 1, space, sample, trials, current.offset + current.trials, tuple(notes))
    return nxt, limits


# --------------------------------------------------------------------------------------------------
# The finals: each arm's top_k search configs rerun with the seeds all arms share, and the best of them.
#
# The search ranks an arm's configs on one seed (study.search_seed), where a lucky seed can carry a
# config. The finals rerun the top_k (diverged trials never qualify) with every seed of
# study.final.seeds; all arms run the same seeds, so report.py pairs the runs of one seed (docs/
# research.md, section 2), and the seeds differ from the search's, so the verdict is measured on runs
# that played no part in choosing the configs (with top_k = 1; with top_k > 1 the best finalist is
# chosen on the finals' own mean, which flatters it a little, as research.md says of --best).


def _score(value: float | None, higher_is_better: bool) -> float:
    if value is None or not math.isfinite(value):
        return math.inf
    return -value if higher_is_better else value


def ranked(search: Sequence[TrialRecord], higher_is_better: bool) -> list[TrialRecord]:
    """The arm's finished search trials, best first (ties: the earlier trial), diverged ones left out."""
    done = [t for t in search if t.finite]
    return sorted(done, key=lambda t: (_score(t.value, higher_is_better), t.index))


def plan_finals(
    search: Sequence[TrialRecord], top_k: int, seeds: Sequence[int], higher_is_better: bool
) -> list[dict]:
    """The finals of one arm, in the order they run: rank by rank, each with every seed."""
    plan = []
    for rank, t in enumerate(ranked(search, higher_is_better)[:top_k], start=1):
        for seed in seeds:
            plan.append(
                {
                    "rank": rank,
                    "seed": int(seed),
                    "params": dict(t.params),
                    "source": str(t.dir) if t.dir else None,
                    "search_value": t.value,
                }
            )
    return plan


def best_finalist(final: Sequence[TrialRecord], higher_is_better: bool) -> int | None:
    """The rank whose finals have the best mean (every seed finished; a diverged seed ranks it worst)."""
    by_rank: dict[int, list[TrialRecord]] = {}
    for t in final:
        by_rank.setdefault(int(t.attrs.get("rank", 0)), []).append(t)
    best, best_score = None, math.inf
    for rank in sorted(by_rank):
        trials = by_rank[rank]
        if any(t.state != "COMPLETE" for t in trials):
            continue
        mean = sum(_score(t.value, higher_is_better) for t in trials) / len(trials)
        if best is None or mean < best_score:
            best, best_score = rank, mean
    return best


# --------------------------------------------------------------------------------------------------
# What the storage holds about a study, read back as plain records (the driver and the report share them).
#
# optuna studies of a study NAME (mars.study.storage): NAME (user attr "spec"), NAME/ARM/searchR (user
# attrs: the round's "space", "sample", "trials", "offset", "notes"), NAME/ARM/final (user attr "plan":
# the finals, each {rank, seed, params, source}). Each trial's user attrs: "driver" (while it runs),
# "dir", and once finished "result": {"status" (completed | diverged), "message", "tokens", "train_s",
# "process_s" (launch to exit, summed over attempts), "overhead_s" (the driver's own time for it),
# "attempts"} (TrialRecord.attrs holds both levels).


SEARCH_PREFIX = "search"


def dist_to_dict(d: Dist) -> dict:
    return {
        "key": d.key,
        "kind": d.kind,
        "lo": d.lo,
        "hi": d.hi,
        "choices": list(d.choices),
        "where": d.where,
    }


def dist_from_dict(x: dict) -> Dist:
    return Dist(x["key"], x["kind"], x["lo"], x["hi"], tuple(x["choices"]), x.get("where", ""))


def round_attrs(r: Round) -> dict:
    return {
        "round": r.number,
        "space": [dist_to_dict(d) for d in r.space.values()],
        "sample": [dist_to_dict(d) for d in r.sample.values()],
        "trials": r.trials,
        "offset": r.offset,
        "notes": list(r.notes),
    }


def round_from_attrs(a: dict) -> Round:
    space = {x["key"]: dist_from_dict(x) for x in a["space"]}
    sample = {x["key"]: dist_from_dict(x) for x in a["sample"]}
    return Round(int(a["round"]), space, sample, int(a["trials"]), int(a["offset"]), tuple(a["notes"]))


@dataclass
class TrialRecord:
    arm: str
    phase: str  # search | final
    round: int  # search round (-1 for finals)
    number: int  # the trial's number in its optuna study
    index: int  # search: the arm's trial index (its dir's number); final: the plan's index
    params: dict[str, Any]
    state: str  # optuna's: RUNNING, COMPLETE, FAIL, ...
    value: float | None
    attrs: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        """completed | diverged | running | failed (abandoned before its values were drawn)."""
        if self.state == "COMPLETE":
            return str(self.attrs.get("status", "completed"))
        return "running" if self.state == "RUNNING" else "failed"

    @property
    def dir(self) -> Path | None:
        d = self.attrs.get("dir")
        return Path(d) if d else None

    @property
    def finite(self) -> bool:
        return self.state == "COMPLETE" and self.value is not None and math.isfinite(self.value)


def study_name(name: str, arm: str, phase: str, round_number: int = 0) -> str:
    return f"{name}/{arm}/{SEARCH_PREFIX}{round_number}" if phase == "search" else f"{name}/{arm}/final"


def relocated(path: Path, root: Path) -> Path:
    """A trial's recorded run dir (STUDY/search/ARM[/SCOPE]/NNN or STUDY/final/ARM/NAME) under the study
    dir `root` as it is now."""
    parts = path.parts
    start = max((i for i, part in enumerate(parts) if part in ("search", "final")), default=len(parts) - 3)
    return root.joinpath(*parts[start:])


def records_of(
    optuna_study, arm: str, phase: str, round_number: int = -1, offset: int = 0, root: Path | None = None
) -> list[TrialRecord]:
    """The trials of one optuna study. root: the study dir now; a trial's recorded dirs (written as
    absolute paths) are read under it (relocated), so a study dir that was moved or copied elsewhere
    finds its trials' run dirs."""
    out = []
    for t in optuna_study.get_trials(deepcopy=False):
        if phase == "search":
            params = {k: choice_value(v) for k, v in t.params.items()}
            index = offset + t.number
        else:
            params = dict(t.user_attrs.get("params", {}))
            index = t.number
        value = t.value if t.state.name == "COMPLETE" else None
        attrs = {**t.user_attrs, **t.user_attrs.get("result", {})}  # the driver stores a result in one attr
        for key in ("dir", "trunk_dir"):
            if root is not None and attrs.get(key):
                attrs[key] = str(relocated(Path(attrs[key]), Path(root)))
        out.append(TrialRecord(arm, phase, round_number, t.number, index, params, t.state.name, value, attrs))
    return out
