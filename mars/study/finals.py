"""The finals: each arm's top_k search configs rerun with the seeds all arms share, and the best of them.

The search ranks an arm's configs on one seed (study.search_seed), where a lucky seed can carry a
config. The finals rerun the top_k (diverged trials never qualify) with every seed of
study.final.seeds; all arms run the same seeds, so report.py pairs the runs of one seed (docs/
research.md, section 2), and the seeds differ from the search's, so the verdict is measured on runs
that played no part in choosing the configs (with top_k = 1; with top_k > 1 the best finalist is
chosen on the finals' own mean, which flatters it a little, as research.md says of --best).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from mars.study.records import TrialRecord


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
