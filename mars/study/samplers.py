"""The samplers, built so that a trial's parameters depend only on the sampler's seed and the trial's
number in its optuna study (and, for TPE, on the results it is shown): a study interrupted and
resumed, or run by several drivers, draws exactly the trials one uninterrupted driver draws.

* sobol: optuna's QMCSampler, scrambled Sobol' (as AlgoPerf's quasi-random search). Its search space
  is the arm's from the first trial on (optuna's would draw the first trial at random), and trial N
  takes point N of the sequence (optuna's counts draws in a study attribute, which two drivers asking
  at once could read alike).
* random: optuna's RandomSampler, seeded per trial with (seed, N).
* tpe: optuna's TPESampler (multivariate, constant liar for trials still running), seeded per trial
  with (seed, N); it models the results present when trial N is asked, so with several trials at a
  time its draws depend on which had finished.
"""

from __future__ import annotations

import warnings

import numpy as np
import optuna
from optuna.samplers import BaseSampler, QMCSampler, RandomSampler, TPESampler


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
