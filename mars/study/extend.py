"""Edges after an arm's search, and auto_extend: widening the range where the best sits at a bound.

After each search round of an arm, the edge rule (mars.analysis.edges: the best trial is bracketed
on each side of each numeric key by a trial worse than it by more than study.edges.tolerance) runs on
all of the arm's finished trials so far, in the current range of each key. Each edge is one line
naming the arm, the key and the side. With study.auto_extend.rounds > 0, an arm with
edges gets another round of study.auto_extend.trials trials:

* each key at an edge is widened there (mars.study.space.Dist.widen: one octave on a log range, half
  the width on a linear one), unless the train config refuses the new bound (gamma below 0, an lr
  below schedule.min_lr): then the edge stays, and the report says that the config holds it there
  (a constrained optimum, such as gamma = 0, or a setting to change);
* the round samples only what is new: each widened key over its new part (the slab beyond the old
  bound; the corner, when two keys widen), every other key over its whole current range;
* its trials count against the arm's budget, which the report shows per round.

An edge left when the rounds are spent marks the arm's comparison "not at the optimum".
"""

from __future__ import annotations

from dataclasses import dataclass

from mars.analysis.edges import Edge, find_edges
from mars.study.space import Dist


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
