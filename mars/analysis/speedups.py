"""The report's two speedups of a group over the baseline, as functions of the seeds they use.

Tokens-to-target speedup: the baseline's tokens to the target over the group's, both read off the
seed-mean curves. Effective-data speedup: the baseline tokens D_eff at which L(D) = a D^-b + c,
fitted to the baseline's mean curve, reaches the group's mean final value, over the group's
tokens. Both are computed from whichever runs are given, so that the point estimates and the
jackknife's leave-one-seed-out estimates (mars.analysis.intervals) are one computation; the
default target (the baseline's mean final value) is recomputed from the baseline's runs given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from mars.analysis.metric import Metric
from mars.analysis.runs import Run
from mars.analysis.stats import FitError, PowerLaw, fit_power_law, mean_curve, mean_std, tokens_to_target


class Speedups:
    """Both speedups of a group against the baseline as functions of which seeds are used, so that
    the point estimates and the jackknife's leave-one-seed-out estimates are the same computation.
    The target is fixed (--target) or, by default, the mean final value of the baseline's seeds used."""

    def __init__(self, metric: Metric, target: float | None):
        self.metric = metric
        self.fixed_target = target
        self._fits: dict[tuple[int, ...], PowerLaw | str] = {}

    def target(self, base: Sequence[Run]) -> float:
        if self.fixed_target is not None:
            return self.fixed_target
        return mean_std([r.final(self.metric.key) for r in base])[0]

    def crossing(self, runs: Sequence[Run], target: float) -> float | None:
        band = mean_curve([r.curve(self.metric.key) for r in runs])
        return None if band is None else tokens_to_target(band.points(), target, self.metric.higher_is_better)

    def speedup(self, group: Sequence[Run], base: Sequence[Run]) -> float | str:
        target = self.target(base)
        if not math.isfinite(target):
            return "the target is not finite"
        base_t = self.crossing(base, target)
        if base_t is None:
            return "the baseline does not reach the target"
        mine = self.crossing(group, target)
        if mine is None:
            return "does not reach the target"
        if mine <= 0:
            return "reaches the target at 0 tokens"
        return base_t / mine

    def fit(self, base: Sequence[Run]) -> PowerLaw | str:
        key = tuple(id(r) for r in base)
        if key not in self._fits:
            self._fits[key] = self._fit(base)
        return self._fits[key]

    def _fit(self, base: Sequence[Run]) -> PowerLaw | str:
        if self.metric.higher_is_better:
            return "L(D) = a D^-b + c is fitted only for metrics where lower is better"
        band = mean_curve([r.curve(self.metric.key) for r in base])
        if band is None:
            return "the baseline's seeds share no token range"
        try:
            return fit_power_law(band.points())
        except FitError as e:
            return str(e)

    def effective(self, group: Sequence[Run], base: Sequence[Run]) -> tuple[float, float] | str:
        """(D_eff, D_eff / the group's mean final tokens), or why there is none."""
        fit = self.fit(base)
        if isinstance(fit, str):
            return f"fit failed: {fit}"
        final = mean_std([r.final(self.metric.key) for r in group])[0]
        if not math.isfinite(final):
            return f"final {self.metric.title} is not finite"
        tokens = fit.tokens_for(final)
        if tokens is None:
            return f"final {self.metric.title} {final:.4g} <= the fit's asymptote c = {fit.c:.4g}"
        return tokens, tokens / mean_std([r.final_tokens(self.metric.key) for r in group])[0]

    def effective_speedup(self, group: Sequence[Run], base: Sequence[Run]) -> float | str:
        result = self.effective(group, base)
        return result if isinstance(result, str) else result[1]
