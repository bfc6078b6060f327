"""Figures for papers: loss curves with seed bands, heatmaps of a 2-D sweep, the plot_curves panels.

Layout rules shared by every figure here: constrained layout, and one legend for the whole figure
placed *outside* the axes (below the panels), so it never covers a curve, a tick label or an axis
label, however many entries it has; the figure grows to hold it and is saved with a tight
bounding box, so nothing is clipped. Curves are labelled with what differs between them
(mars.analysis.labels); what they share becomes the legend's title.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mars.analysis.metric import Metric, metric_of
from mars.analysis.paper import PAPER_BEST_VAL, PAPER_TOKENS
from mars.analysis.runs import Run
from mars.analysis.stats import Band
from mars.files import write_atomic

DPI = 150


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def token_unit(max_tokens: float) -> tuple[float, str]:
    if max_tokens >= 1e9:
        return 1e9, "B"
    if max_tokens >= 1e6:
        return 1e6, "M"
    if max_tokens >= 1e3:
        return 1e3, "K"
    return 1.0, ""


def time_unit(max_seconds: float) -> tuple[float, str]:
    if max_seconds >= 2 * 3600:
        return 3600.0, "hours"
    if max_seconds >= 120:
        return 60.0, "minutes"
    return 1.0, "seconds"


def colors(n: int) -> list:
    """n distinguishable colours: tab10 up to 10 curves, tab20 up to 20, then a sampled colormap."""
    plt = pyplot()
    if n <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(n)]
    if n <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(n)]
    return [plt.get_cmap("turbo")(x) for x in np.linspace(0.05, 0.95, n)]


def legend_outside(fig, axes: Sequence, title: str | None = None, fontsize: float = 8) -> None:
    """One legend for all panels, below them, with as many columns as fit the figure's width.

    Entries come from every axes (a label shared by several panels appears once). Needs a figure
    made with layout="constrained", which reserves the legend's space ("outside lower center").
    """
    entries: dict[str, object] = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            if text and not text.startswith("_"):
                entries.setdefault(text, handle)
    if not entries:
        return
    longest = max(len(t) for t in entries)
    entry_pt = (longest * 0.55 + 4.0) * fontsize  # text + handle + padding, in points
    ncols = max(1, min(len(entries), int(0.95 * fig.get_figwidth() * 72 // entry_pt)))
    fig.legend(
        list(entries.values()),
        list(entries.keys()),
        loc="outside lower center",
        ncols=ncols,
        fontsize=fontsize,
        title=title or None,
        title_fontsize=fontsize + 0.5,
        frameon=False,
    )


def save(fig, out: Path, pdf: bool = True) -> list[Path]:
    """PNG (and a PDF next to it for papers), tight bounding box so the outside legend is kept."""
    out.parent.mkdir(parents=True, exist_ok=True)
    written = [out, out.with_suffix(".pdf")] if pdf else [out]
    for path in written:  # each replaced in one step: drivers of one study may write its report at once
        write_atomic(
            path, lambda tmp, fmt=path.suffix[1:]: fig.savefig(tmp, format=fmt, dpi=DPI, bbox_inches="tight")
        )
    pyplot().close(fig)
    return written


# ----------------------------------------------------------------------------- report figures


@dataclass
class GroupCurves:
    """One group's seed-averaged curves as the report draws them: one band per panel."""

    label: str
    bands: Sequence[Band | None]
    baseline: bool = False
    n_seeds: int = 1


def focus_ylim(
    ax, series: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], higher_is_better: bool = False
) -> None:
    """Set the y range from (x, low, high) series, leaving the first tenth of the x range out of
    its worse end (the top for losses, the bottom where higher is better): early losses (near
    ln(vocab) = 10.8) would squeeze the part of the curves where optimizers differ into a few
    pixels. Log axes keep matplotlib's own range."""
    series = [(np.asarray(x, float), np.asarray(lo, float), np.asarray(hi, float)) for x, lo, hi in series]
    series = [s for s in series if s[0].size]
    if not series or ax.get_yscale() != "linear":
        return
    cut = 0.1 * max(float(np.nanmax(x)) for x, _, _ in series)
    tops = [hi[x >= cut] if not higher_is_better else hi for x, _, hi in series]
    lows = [lo[x >= cut] if higher_is_better else lo for x, lo, _ in series]
    tops = [t[np.isfinite(t)] for t in tops]
    lows = [lo[np.isfinite(lo)] for lo in lows]
    if not any(t.size for t in tops) or not any(lo.size for lo in lows):
        return
    top = max(float(t.max()) for t in tops if t.size)
    bottom = min(float(lo.min()) for lo in lows if lo.size)
    if top > bottom:
        pad = 0.05 * (top - bottom)
        ax.set_ylim(bottom - pad, top + pad)


def plot_groups(out: Path, groups: Sequence[GroupCurves], target: float | None, **options) -> list[Path]:
    """groups_figure() saved as PNG and PDF."""
    return save(groups_figure(groups, target, **options), out)


def groups_figure(
    groups: Sequence[GroupCurves],
    target: float | None,
    title: str | None = None,
    panels: Sequence[str] = ("Validation loss", "Training loss"),
    higher_is_better: bool = False,
):
    """One panel per band (the report's metric on the left, with the target dotted; then train or
    val loss) against tokens: each group's mean over seeds, shaded from the lowest to the highest
    seed at each point; the baseline in black."""
    plt = pyplot()
    fig, axes = plt.subplots(
        1, len(panels), figsize=(5.5 * len(panels), 4.4), layout="constrained", squeeze=False
    )
    axes = axes[0]
    bands = [b for g in groups for b in g.bands if b is not None]
    scale, suffix = token_unit(max((b.tokens[-1] for b in bands), default=1.0))
    palette = iter(colors(sum(not g.baseline for g in groups)))
    for g in groups:
        color = "black" if g.baseline else next(palette)
        text = f"{g.label} (baseline)" if g.baseline else g.label
        text += f", n={g.n_seeds}"
        for i, (ax, band) in enumerate(zip(axes, g.bands, strict=True)):
            if band is None:
                continue
            x = band.tokens / scale
            few = i == 0 and len(x) < 30
            ax.plot(x, band.mean, color=color, lw=1.6, label=text, marker="o" if few else None, ms=3)
            if g.n_seeds > 1:
                ax.fill_between(x, band.low, band.high, color=color, alpha=0.18, lw=0)
    if target is not None and math.isfinite(target):
        axes[0].axhline(target, color="0.45", ls=":", lw=1.2, label=f"target {target:.4g}")
    for i, (ax, what) in enumerate(zip(axes, panels, strict=True)):
        ax.set_xlabel(f"Training tokens ({suffix})" if suffix else "Training tokens")
        ax.set_ylabel(what)
        ax.grid(True, alpha=0.3)
        series = [(b.tokens, b.low, b.high) for g in groups if (b := g.bands[i]) is not None]
        focus_ylim(ax, series, higher_is_better and i == 0)
    if title:
        fig.suptitle(title)
    legend_outside(fig, axes, title="mean over seeds; shaded: min to max over seeds")
    return fig


def heatmap(
    out: Path,
    row_key: str,
    col_key: str,
    cells: dict[tuple[str, str], Sequence[float]],
    metric: str,
    rows: Sequence[str],
    cols: Sequence[str],
    title: str | None = None,
    pdf: bool = False,
    higher_is_better: bool = False,
) -> list[Path]:
    """A 2-D sweep: rows are values of row_key, columns of col_key, each cell the mean of its values
    (the best cell in bold: the lowest, or the highest where higher is better) with "± std" under it
    when it holds several seeds. The colour map runs from worse (light) to better (dark)."""
    plt = pyplot()
    grid = np.full((len(rows), len(cols)), np.nan)
    text: dict[tuple[int, int], str] = {}
    for (r, c), values in cells.items():
        vals = np.asarray([v for v in values if v is not None], dtype=float)
        if not vals.size:
            continue
        i, j = rows.index(r), cols.index(c)
        grid[i, j] = vals.mean()
        text[i, j] = f"{vals.mean():.3f}" + (f"\n± {vals.std(ddof=1):.3f}" if vals.size > 1 else "")
    fig, ax = plt.subplots(figsize=(1.4 * len(cols) + 2.8, 0.85 * len(rows) + 2.0), layout="constrained")
    cmap = plt.get_cmap("viridis" if higher_is_better else "viridis_r").with_extremes(bad="0.85")
    finite = grid[np.isfinite(grid)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, aspect="auto", vmin=vmin, vmax=vmax)
    ax.set_xticks(range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel(col_key)
    ax.set_ylabel(row_key)
    best = (finite.max() if higher_is_better else finite.min()) if finite.size else None
    for (i, j), t in text.items():
        shade = cmap((grid[i, j] - vmin) / (vmax - vmin) if vmax > vmin else 0.5)
        luminance = 0.299 * shade[0] + 0.587 * shade[1] + 0.114 * shade[2]
        ax.text(
            j,
            i,
            t,
            ha="center",
            va="center",
            fontsize=8,
            color="black" if luminance > 0.5 else "white",
            fontweight="bold" if grid[i, j] == best else "normal",
        )
    fig.colorbar(im, ax=ax, label=metric)
    ax.set_title(title or metric)
    return save(fig, out, pdf=pdf)


# ----------------------------------------------------------------------------- plot_curves


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over `window` points (the first points average what there is)."""
    if window <= 1:
        return values
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_curves(runs: Sequence[Run], out: Path, **options) -> list[Path]:
    """curves_figure(runs, **options) saved as PNG and PDF."""
    return save(curves_figure(runs, **options), out)


DEFAULT_PANELS = ("train/loss", "val/loss")


def curves_figure(
    runs: Sequence[Run],
    metrics: Sequence[Metric | str] = DEFAULT_PANELS,
    zoom: Sequence[float] | None = None,
    logx: bool = False,
    logy: bool = False,
    smooth_window: int = 1,
    title: str | None = None,
    paper_markers: bool = True,
    legend_title: str | None = None,
    full_range: bool = False,
):
    """One column of panels per metric (default: train loss, val loss), against tokens (top) and
    wall-clock time (bottom, when the inputs have times); one colour per run, labelled run.label;
    the paper's reference losses as stars on the val loss panel. `smooth_window` averages metrics
    logged on training lines (not evaluations). The y range leaves out the first tenth of each
    panel's x range (focus_ylim) unless full_range."""
    plt = pyplot()
    from matplotlib.ticker import FormatStrFormatter

    metrics = [m if isinstance(m, Metric) else metric_of(m) for m in metrics]
    all_points = [p for r in runs for m in metrics for p in r.points(m.key)]
    tok_scale, tok_suffix = token_unit(max((p[0] for p in all_points), default=1.0))
    finite_t = [p[1] for p in all_points if math.isfinite(p[1])]
    t_scale, t_name = time_unit(max(finite_t, default=1.0))
    rows = 2 if finite_t else 1  # no wall-clock panels for inputs without times (e.g. some W&B exports)
    fig, axes = plt.subplots(
        rows, len(metrics), figsize=(6 * len(metrics), 4 * rows), layout="constrained", squeeze=False
    )
    palette = colors(len(runs))
    for run, color in zip(runs, palette, strict=True):
        for col, m in enumerate(metrics):
            series = run.points(m.key)
            if not series:
                continue
            ys = [p[2] for p in series]
            if not m.is_evaluation:
                ys = smooth(ys, smooth_window)
            style = {"color": color, "label": run.label, "lw": 1.4}
            before = run.parent_points(m.key)  # a fork: its parent's curve up to the fork, thin
            if before:
                for row, x in enumerate((0, 1)[:rows]):
                    pts = [(p[x] / (tok_scale if x == 0 else t_scale), p[2]) for p in before]
                    pts = [p for p in pts if math.isfinite(p[0])]
                    if pts:
                        axes[row, col].plot(*zip(*pts, strict=True), color=color, lw=0.7, alpha=0.6)
                        axes[row, col].plot(*pts[-1], marker="|", ms=10, color=color, ls="none")
            if m.is_evaluation and len(series) < 30:
                style.update(marker="o", ms=3)
            axes[0, col].plot([p[0] / tok_scale for p in series], ys, **style)
            timed = [(p[1] / t_scale, y) for p, y in zip(series, ys, strict=True) if math.isfinite(p[1])]
            if timed and rows == 2:
                axes[1, col].plot(*zip(*timed, strict=True), **style)
        val_col = next((i for i, m in enumerate(metrics) if m.key == "val/loss"), None)
        paper = run.paper_key
        if paper_markers and paper and val_col is not None and run.val:
            reach = max(p[0] for p in run.val) * 1.05
            for tokens, best in zip(PAPER_TOKENS, PAPER_BEST_VAL[paper], strict=True):
                if tokens <= reach:
                    axes[0, val_col].plot(
                        tokens / tok_scale,
                        best,
                        marker="*",
                        ms=12,
                        color=color,
                        mec="k",
                        ls="none",
                        label=f"paper {paper[0]} {paper[1]} (best val)",
                    )
    xlabels = (
        f"Training tokens ({tok_suffix})" if tok_suffix else "Training tokens",
        f"Wall-clock time ({t_name})",
    )
    for row, xlabel in enumerate(xlabels[:rows]):
        for col, m in enumerate(metrics):
            ax = axes[row, col]
            ax.set_xlabel(xlabel)
            ax.set_ylabel(m.axis_label)
            ax.grid(True, alpha=0.3)
            if logx:
                ax.set_xscale("log")
            if logy:
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(FormatStrFormatter("%.2f"))
                ax.yaxis.set_minor_formatter(FormatStrFormatter("%.2f"))
                ax.tick_params(axis="y", which="minor", labelsize=7)
            if not full_range:
                lines = [(line.get_xdata(), line.get_ydata(), line.get_ydata()) for line in ax.lines]
                focus_ylim(ax, lines, m.higher_is_better)
    if zoom is not None:
        _zoom_insets(axes[0], zoom)
    if title:
        fig.suptitle(title)
    legend_outside(fig, axes.flat, title=legend_title)
    return fig


def _zoom_insets(axes: Sequence, zoom: Sequence[float]) -> None:
    """A magnified copy of the loss-vs-tokens curves in the upper right, where loss curves fall away."""
    x0, x1, y0, y1 = zoom
    for ax in axes:
        if not ax.lines:
            continue
        inset = ax.inset_axes([0.52, 0.52, 0.45, 0.43])
        for line in ax.lines:
            inset.plot(
                line.get_xdata(),
                line.get_ydata(),
                color=line.get_color(),
                lw=line.get_linewidth(),
                marker=line.get_marker(),
                ms=line.get_markersize(),
                ls=line.get_linestyle(),
            )
        inset.set_xlim(x0, x1)
        inset.set_ylim(y0, y1)
        inset.grid(True, alpha=0.3)
        inset.tick_params(labelsize=7)
        indicator = ax.indicate_inset_zoom(inset, edgecolor="0.4")
        # a zoom window reaching past the axes must not draw its frame over the legend below
        parts = (
            [indicator.rectangle, *indicator.connectors]
            if hasattr(indicator, "rectangle")
            else [indicator[0], *indicator[1]]
        )
        for artist in parts:
            artist.set_clip_on(True)
            artist.set_clip_box(ax.bbox)
