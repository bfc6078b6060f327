"""Performance profiles (Dolan and Moré 2002, AlgoPerf's scoring): over a set of cells (here every budget of
every model size of a study), the share of cells in which an arm's cost is within a factor tau of the best
arm's cost there, as a function of tau >= 1. An arm that is best everywhere is at 1 from tau = 1; one
that never gets there stays at 0.

A cell's cost, for a study with budgets (mars.study.scale): the tokens (or training seconds) an
arm needs to reach the cell's target, the baseline's median final value at that size and budget, read off
the arm's median final value over its budgets, linear in tokens between two budgets. An arm already at
the target at the smallest budget is given the smallest budget's tokens (nothing smaller was trained:
its ratio is then an upper bound); one that does not reach it within the largest budget has an infinite
cost. Seconds are tokens over the arm's throughput at that size (tokens per training second).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

TAUS = (1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0)  # the table's columns


def tokens_to_reach(curve: Sequence[tuple[float, float]], target: float) -> float:
    """Tokens at which a curve of (tokens, value) points, sorted by tokens, first reaches `target` (value
    <= target), linear between points; the first point's tokens when it is already there; inf never."""
    prev = None
    for d, v in curve:
        if not math.isfinite(v):
            prev = None
            continue
        if v <= target:
            if prev is None:
                return d
            d0, v0 = prev
            return d0 + (v0 - target) / (v0 - v) * (d - d0)
        prev = (d, v)
    return math.inf


def ratios(costs: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """{cell: {arm: cost}} -> {arm: {cell: cost / the cell's best cost}} (inf where an arm never gets there,
    or where no arm does)."""
    out: dict[str, dict[str, float]] = {}
    for cell, by_arm in costs.items():
        best = min(by_arm.values(), default=math.inf)
        for arm, cost in by_arm.items():
            out.setdefault(arm, {})[cell] = cost / best if math.isfinite(best) and best > 0 else math.inf
    return out


def profile(arm_ratios: dict[str, float], tau: float) -> float:
    """rho(tau): the share of the arm's cells with a ratio <= tau."""
    values = list(arm_ratios.values())
    return sum(r <= tau for r in values) / len(values) if values else math.nan


def profile_figure(
    path: Path, curves: dict[str, dict[str, dict[str, float]]], title: str, tau_max: float = 4.0
) -> list[Path]:
    """One panel per cost ("tokens", "seconds"): rho(tau) of every arm as a step function, log tau axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k, v in curves.items() if v]
    if not panels:
        return []
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, what in zip(axes[0], panels, strict=True):
        finite = [r for arm in curves[what].values() for r in arm.values() if math.isfinite(r)]
        top = max([tau_max, *(r * 1.05 for r in finite)])
        for arm, arm_ratios in curves[what].items():
            taus = sorted({1.0, top, *(r for r in arm_ratios.values() if math.isfinite(r))})
            ax.step(taus, [profile(arm_ratios, t) for t in taus], where="post", label=arm)
        ax.set_xscale("log")
        ax.set_xlim(1.0, top)
        ticks = [t for t in (1, 1.25, 1.5, 2, 3, 4, 6, 8, 16, 32) if t <= top]
        ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel(f"tau (cost in {what} / the best arm's)")
        ax.set_ylabel("share of cells within tau of the best")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return [path]
