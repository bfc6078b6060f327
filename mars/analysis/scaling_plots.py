"""The figures of a ladder of budgets and sizes (mars.analysis.scaling), in the layout of mars.analysis.plots:

* loss_vs_tokens.png: one panel per size; per arm its final losses (mean, bars: min to max over seeds)
  against the tokens of each budget, log x, and its fitted L(D) = E + A D^-alpha, dashed beyond the
  largest budget;
* speedup_vs_tokens.png: one panel per size; per arm its effective-data speedup over the baseline as a
  function of D with the 95% interval as a band; beyond the largest budget (the dotted line) both are
  extrapolations, drawn lighter and labelled with the factor ("x4 beyond the largest budget");
* speedup_vs_size.png: per arm and budget, the speedup at that budget against the model's non-embedding
  parameters (log x), with the intervals as bars (only with 2+ sizes).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from mars.analysis.plots import colors, legend_outside, pyplot, save
from mars.analysis.scaling import Analysis, Ladder, extrapolation_label


def _panels(n: int):
    plt = pyplot()
    fig, axes = plt.subplots(1, n, figsize=(4.4 * n, 3.6), layout="constrained", squeeze=False)
    return fig, list(axes[0])


def _log_x_axes(ax, xlabel: str, ylabel: str, title: str) -> None:
    """The finish every panel of these figures shares: a log x axis, the labels, a small title, a grid."""
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)


def _title(size) -> str:
    return f"{size.name}: {size.params / 1e6:.3g}M non-embedding params" if size.name else ""


def loss_figure(out: Path, ladder: Ladder, an: Analysis, ylabel: str = "final val loss") -> list[Path]:
    fig, axes = _panels(len(ladder.sizes))
    palette = dict(zip(ladder.arms, colors(len(ladder.arms)), strict=True))
    for ax, size in zip(axes, ladder.sizes, strict=True):
        largest, notes = 0.0, []
        for arm in ladder.arms:
            finals = ladder.finals(arm, size)
            xs = sorted(finals)
            if not xs:
                continue
            largest = max(largest, xs[-1])
            vals = [np.array(list(finals[x].values()), dtype=float) for x in xs]
            mean = np.array([v.mean() for v in vals])
            err = np.array([[m - v.min() for m, v in zip(mean, vals, strict=True)],
                            [v.max() - m for m, v in zip(mean, vals, strict=True)]])  # fmt: skip
            ax.errorbar(xs, mean, yerr=err, fmt="o", color=palette[arm], capsize=3, label=f"{arm}: seeds")
            f = an.loss_fits.get((arm, size.name))
            if f is None or isinstance(f, str):
                continue
            inside = np.geomspace(xs[0], xs[-1], 50)
            beyond = np.geomspace(xs[-1], an.extrapolate * xs[-1], 20)
            ax.plot(inside, f.loss(inside), color=palette[arm], label=f"{arm}: fit")
            notes.append(f"{arm}: E={f.c:.3g}, alpha={f.b:.3g}")
            ax.plot(beyond, f.loss(beyond), color=palette[arm], linestyle="--", alpha=0.6)
        if largest:
            ax.axvline(largest, color="grey", linestyle=":", linewidth=1)
            ax.annotate(
                f"dashed: {extrapolation_label(an.extrapolate)}", (0.98, 0.97), xycoords="axes fraction",
                ha="right", va="top", fontsize=7,
            )  # fmt: skip
        if notes:
            ax.annotate("\n".join(notes), (0.02, 0.03), xycoords="axes fraction", fontsize=7, va="bottom")
        _log_x_axes(ax, "training tokens (log)", ylabel, _title(size))
    fig.suptitle("Final loss against tokens, with L(D) = E + A D^-alpha")
    legend_outside(fig, axes)
    return save(fig, out)


def speedup_figure(out: Path, ladder: Ladder, an: Analysis) -> list[Path]:
    arms = [a for a in ladder.arms if a != ladder.baseline]
    if not arms:
        return []
    fig, axes = _panels(len(ladder.sizes))
    palette = dict(zip(ladder.arms, colors(len(ladder.arms)), strict=True))
    for ax, size in zip(axes, ladder.sizes, strict=True):
        ax.axhline(1.0, color="black", linewidth=0.8)
        for arm in arms:
            curve = an.speedup_curves.get((arm, size.name), [])
            pts = [p for p in curve if p.value is not None]
            if not pts:
                continue
            largest = max(p.d / p.extrapolation for p in pts)
            for part, alpha in (
                ([p for p in pts if not p.extrapolated], 1.0),
                ([p for p in pts if p.d >= largest], 0.45),
            ):
                if not part:
                    continue
                d = np.array([p.d for p in part])
                style = {"linestyle": "-", "label": arm} if alpha == 1.0 else {"linestyle": "--"}
                ax.plot(d, [p.value for p in part], color=palette[arm], alpha=alpha, **style)
                band = [
                    (p.d, p.interval.low, p.interval.high) for p in part if not isinstance(p.interval, str)
                ]
                if band:
                    bd, lo, hi = map(np.array, zip(*band, strict=True))
                    ax.fill_between(bd, lo, hi, color=palette[arm], alpha=0.2 * alpha, linewidth=0)
            ax.axvline(largest, color="grey", linestyle=":", linewidth=1)
            ax.annotate(
                f"right of the dotted line: {extrapolation_label(an.extrapolate)}", (0.98, 0.03),
                xycoords="axes fraction", ha="right", va="bottom", fontsize=7,
            )  # fmt: skip
            measured = [p for p in an.speedups.get((arm, size.name), []) if p.value is not None]
            ax.plot([p.d for p in measured], [p.value for p in measured], "o", color=palette[arm])
        _log_x_axes(
            ax, "training tokens D (log)", f"effective-data speedup over {ladder.baseline}", _title(size)
        )
    fig.suptitle("Effective-data speedup: the baseline's tokens to the arm's loss at D, over D (band: 95%)")
    legend_outside(fig, axes)
    return save(fig, out)


def size_figure(out: Path, ladder: Ladder, an: Analysis) -> list[Path]:
    arms = [a for a in ladder.arms if a != ladder.baseline]
    if len(ladder.sizes) < 2 or not arms:
        return []
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8), layout="constrained")
    budgets = ladder.budgets
    palette = colors(len(arms) * len(budgets))
    ax.axhline(1.0, color="black", linewidth=0.8)
    k = 0
    for arm in arms:
        for steps in budgets:
            xs, ys, lo, hi = [], [], [], []
            for size in ladder.sizes:
                d = float(steps * size.tokens_per_step)
                p = next((p for p in an.speedups.get((arm, size.name), []) if math.isclose(p.d, d)), None)
                if p is None or p.value is None:
                    continue
                xs.append(size.params)
                ys.append(p.value)
                iv = p.interval
                lo.append(p.value - iv.low if not isinstance(iv, str) else 0.0)
                hi.append(iv.high - p.value if not isinstance(iv, str) else 0.0)
            if xs:
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, color=palette[k],
                            label=f"{arm}, {steps} steps")  # fmt: skip
            k += 1
    speedup = f"effective-data speedup over {ladder.baseline}"
    _log_x_axes(
        ax, "non-embedding parameters (log)", speedup, "Speedup against model size, per budget (bars: 95%)"
    )
    legend_outside(fig, [ax])
    return save(fig, out)


def scaling_figures(out_dir: Path, ladder: Ladder, an: Analysis) -> list[Path]:
    out_dir = Path(out_dir)
    return [
        *loss_figure(out_dir / "loss_vs_tokens.png", ladder, an),
        *speedup_figure(out_dir / "speedup_vs_tokens.png", ladder, an),
        *size_figure(out_dir / "speedup_vs_size.png", ladder, an),
    ]
