"""A research report over one or more sweeps: per setting, seeds pooled, compared to a baseline.

build_report() does the reading, grouping and statistics (raising AnalysisError on bad input);
markdown_table() / render_markdown() / to_json() present it; write_report() writes report.md,
report.json and the figures. Definitions (docs/research.md has the longer story):

* final / best val loss: the last / lowest val/loss of each run; mean and sample std (ddof=1)
  over the group's seeds;
* tokens to target, per run: where its val curve first reaches the target, linear in tokens
  between evaluations; runs that never reach it are counted ("2/3 reached") and left out of the
  mean;
* speedup: the baseline's tokens to target over the group's, both read off the seed-mean val
  curves (so it exists even when a seed stops short of the target, which with the default
  target - the baseline's own mean final loss - happens to about half of the baseline's seeds);
* effective-data speedup: L(D) = a D^-b + c fitted to the baseline's mean val curve; a group's
  mean final loss L needs D_eff = ((L - c) / a)^(-1/b) baseline tokens; speedup = D_eff / the
  group's tokens;
* Welch's t-test of the group's final val losses against the baseline's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mars.analysis.errors import AnalysisError
from mars.analysis.groups import (
    Group,
    check_comparable,
    duplicate_seeds,
    group_runs,
    parse_baseline,
    seeds_of,
    select_baseline,
    sort_groups,
    value_key,
)
from mars.analysis.labels import Column, cell, common_description, label, varying_columns
from mars.analysis.plots import GroupCurves, heatmap, plot_groups
from mars.analysis.runs import load_runs, require_val_loss
from mars.analysis.stats import (
    Band,
    FitError,
    PowerLaw,
    Welch,
    fit_power_law,
    mean_curve,
    mean_std,
    tokens_to_target,
    welch,
)

ALPHA = 0.05


@dataclass
class RunResult:
    path: str
    seed: Any
    data_seed: Any
    final_val_loss: float
    best_val_loss: float
    final_tokens: float  # tokens at the last evaluation
    tokens_to_target: float | None


@dataclass
class GroupResult:
    label: str
    cells: list[str | None]
    runs: list[RunResult]
    val: Band | None
    train: Band | None
    baseline: bool = False
    tokens_to_target_curve: float | None = None  # crossing of the seed-mean val curve
    speedup: float | None = None
    speedup_note: str = ""
    effective_tokens: float | None = None
    effective_speedup: float | None = None
    effective_note: str = ""
    extrapolated: bool = False
    welch: Welch | None = None
    welch_note: str = ""

    @property
    def n(self) -> int:
        return len(self.runs)

    @property
    def final(self) -> tuple[float, float | None]:
        return mean_std([r.final_val_loss for r in self.runs])

    @property
    def best(self) -> tuple[float, float | None]:
        return mean_std([r.best_val_loss for r in self.runs])

    @property
    def final_tokens(self) -> float:
        return mean_std([r.final_tokens for r in self.runs])[0]

    @property
    def reached(self) -> list[float]:
        return [r.tokens_to_target for r in self.runs if r.tokens_to_target is not None]


@dataclass
class Report:
    roots: list[Path]
    columns: list[Column]
    common: str
    groups: list[GroupResult]
    baseline: int
    baseline_note: str
    target: float
    target_note: str
    fit: PowerLaw | None
    fit_note: str
    warnings: list[str] = field(default_factory=list)

    @property
    def n_runs(self) -> int:
        return sum(g.n for g in self.groups)


def build_report(
    roots: Sequence[Path], baseline: Sequence[str] = (), target: float | None = None, best: bool = False
) -> Report:
    """Read, check, group and compare the runs under `roots`; AnalysisError on bad input."""
    parse_baseline(baseline)  # a malformed --baseline fails before anything is read
    if target is not None and not math.isfinite(target):
        raise AnalysisError(f"--target {target} is not a finite loss")
    runs = load_runs(list(roots))
    require_val_loss(runs)
    check_comparable(runs)
    groups = group_runs(runs)
    columns = varying_columns([g.item for g in groups])
    groups = sort_groups(groups, columns)
    labels = [label(columns, g.item) for g in groups]
    base_index, base_note = select_baseline(groups, baseline, columns, labels, best=best)
    results = [_group_result(g, text, columns) for g, text in zip(groups, labels, strict=True)]
    base = results[base_index]
    base.baseline = True
    if target is None:
        target = base.final[0]
        target_note = "the baseline's mean final val loss"
        if not math.isfinite(target):
            raise AnalysisError("the baseline's final val loss is not finite (diverged?): pass --target LOSS")
    else:
        target_note = "--target"
    fit, fit_note = None, ""
    try:
        if base.val is None:
            raise FitError("the baseline's seeds share no token range")
        fit = fit_power_law(base.val.points())
    except FitError as e:
        fit_note = str(e)
    for g, group in zip(results, groups, strict=True):
        for r, run in zip(g.runs, group.runs, strict=True):
            r.tokens_to_target = tokens_to_target(run.val, target)
        g.tokens_to_target_curve = tokens_to_target(g.val.points(), target) if g.val is not None else None
    for g in results:
        _compare(g, base, fit, fit_note)
    warnings = _warnings(groups, results)
    return Report(
        roots=list(roots),
        columns=columns,
        common=common_description(columns, [g.item for g in groups]),
        groups=results,
        baseline=base_index,
        baseline_note=base_note,
        target=float(target),
        target_note=target_note,
        fit=fit,
        fit_note=fit_note,
        warnings=warnings,
    )


def _group_result(group: Group, text: str, columns: Sequence[Column]) -> GroupResult:
    runs = [
        RunResult(
            path=str(r.path),
            seed=seeds_of(r)[0],
            data_seed=seeds_of(r)[1],
            final_val_loss=r.final_val,
            best_val_loss=r.best_val,
            final_tokens=r.final_val_tokens,
            tokens_to_target=None,
        )
        for r in group.runs
    ]
    return GroupResult(
        label=text,
        cells=[cell(c, group.item) for c in columns],
        runs=runs,
        val=mean_curve([r.val for r in group.runs]),
        train=mean_curve([r.train for r in group.runs]) if all(r.train for r in group.runs) else None,
    )


def _compare(g: GroupResult, base: GroupResult, fit: PowerLaw | None, fit_note: str) -> None:
    """Fill in the group's speedups and its test against the baseline."""
    base_t = base.tokens_to_target_curve
    if base_t is None:
        g.speedup_note = "the baseline does not reach the target"
    elif g.tokens_to_target_curve is None:
        g.speedup_note = "does not reach the target"
    elif g.tokens_to_target_curve > 0:
        g.speedup = base_t / g.tokens_to_target_curve
    else:
        g.speedup_note = "reaches the target at 0 tokens"
    if fit is None:
        g.effective_note = f"fit failed: {fit_note}"
    else:
        loss = g.final[0]
        g.effective_tokens = fit.tokens_for(loss)
        if not math.isfinite(loss):
            g.effective_note = "final loss is not finite"
        elif g.effective_tokens is None:
            g.effective_note = f"final loss {loss:.4g} <= the fit's asymptote c = {fit.c:.4g}"
        else:
            g.effective_speedup = g.effective_tokens / g.final_tokens
            g.extrapolated = bool(g.effective_tokens > fit.max_tokens * (1 + 1e-9))
    if g.baseline:
        g.welch_note = "baseline"
    else:
        result = welch([r.final_val_loss for r in g.runs], [r.final_val_loss for r in base.runs])
        if isinstance(result, Welch):
            g.welch = result
        else:
            g.welch_note = result


def _warnings(groups: Sequence[Group], results: Sequence[GroupResult]) -> list[str]:
    out = []
    for g, res in zip(groups, results, strict=True):
        name = res.label or "all runs"
        for dup in duplicate_seeds(g):
            out.append(f"{name}: {dup} (the same run twice is not two seeds)")
        ends = {r.final_tokens for r in res.runs}
        if len(ends) > 1:
            short = [r.path for r in res.runs if r.final_tokens < max(ends)]
            out.append(
                f"{name}: runs end at different tokens ({', '.join(_tokens(t) for t in sorted(ends))}); "
                f"{', '.join(short)} stopped early (killed?), so its final loss is from earlier in training"
            )
        for r in res.runs:
            if not math.isfinite(r.final_val_loss):
                out.append(f"{r.path}: final val loss is {r.final_val_loss} (diverged?)")
    return out


# ----------------------------------------------------------------------------- presentation


def _tokens(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def _pm(mean: float, std: float | None, digits: int = 4) -> str:
    if not math.isfinite(mean):
        return str(mean)
    return f"{mean:.{digits}f} ± " + ("-" if std is None else f"{std:.{digits}f}")


def _tokens_pm(values: list[float]) -> str:
    if not values:
        return "-"
    mean, std = mean_std(values)
    return f"{_tokens(mean)} ± " + ("-" if std is None else _tokens(std))


def _speedup(g: GroupResult) -> str:
    if g.speedup is None:
        return f"n/a ({g.speedup_note})"
    return f"{g.speedup:.2f}x" + (" (baseline)" if g.baseline else "")


def _effective(g: GroupResult) -> str:
    if g.effective_speedup is None:
        return f"n/a ({g.effective_note})"
    return f"{g.effective_speedup:.2f}x" + ("*" if g.extrapolated else "")


def _p(g: GroupResult) -> tuple[str, str]:
    if g.welch is None:
        return ("-", "-") if g.baseline else (f"n/a ({g.welch_note})", "-")
    return f"{g.welch.p:.3g}", "yes" if g.welch.significant else "no"


HEADERS = (
    "seeds",
    "final val loss",
    "best val loss",
    "reached target",
    "tokens to target (per run)",
    "tokens to target (mean curve)",
    "speedup",
    "effective-data speedup",
    "p (Welch)",
    f"p < {ALPHA:g}",
)


def markdown_table(report: Report) -> str:
    """One row per group: its values in the varying columns, then the statistics."""
    keys = [c.header for c in report.columns] or ["group"]
    lines = ["| " + " | ".join([*keys, *HEADERS]) + " |", "|" + "---|" * len(keys) + "---:|" * len(HEADERS)]
    for g in report.groups:
        cells = [v if v is not None else "-" for v in g.cells] or ["all runs"]
        if g.baseline:
            cells[0] = f"**{cells[0]}**"
        row = [
            *cells,
            str(g.n),
            _pm(*g.final),
            _pm(*g.best),
            f"{len(g.reached)}/{g.n}",
            _tokens_pm(g.reached),
            _tokens(g.tokens_to_target_curve),
            _speedup(g),
            _effective(g),
            *_p(g),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def header_lines(report: Report) -> list[str]:
    roots = ", ".join(f"`{r}`" for r in report.roots)
    lines = [
        f"Runs: {report.n_runs} in {len(report.groups)} group(s) under {roots}"
        + (f"; shared: {report.common}" if report.common else ""),
        f"Baseline (bold): {report.baseline_note}",
        f"Target val loss: {report.target:.4f} ({report.target_note})",
    ]
    if report.fit is not None:
        f = report.fit
        lines.append(
            f"Fit of the baseline's mean val curve: L(D) = a * D^-b + c with a = {f.a:.4g}, b = {f.b:.4g}, "
            f"c = {f.c:.4g} ({f.n_points} points, RMSE {f.rmse:.2g})"
        )
    else:
        lines.append(f"Fit of the baseline's mean val curve: failed ({report.fit_note})")
    return lines


NOTES = """\
- seeds: runs pooled into the group (same settings, different train.seed / train.data_seed).
- final / best val loss: mean ± sample std over seeds (`-`: one seed).
- reached target / tokens to target (per run): runs whose val curve gets to the target, and where
  (interpolated linearly in tokens between evaluations), mean ± std over the runs that reach it.
- tokens to target (mean curve): where the seed-mean val curve reaches the target.
- speedup: the baseline's tokens to target / the group's, both from the mean curves.
- effective-data speedup: D_eff / the group's tokens, where D_eff = L^-1(group's mean final loss)
  on the fit above: the baseline tokens that loss would take (`*`: beyond the tokens the fit saw).
- p (Welch): Welch's t-test of the group's final val losses against the baseline's (two-sided);
  with 3 seeds a side it detects only differences several times the seed spread."""


def render_markdown(report: Report, figures: Sequence[str] = ()) -> str:
    parts = [
        "# Sweep report",
        "",
        *(f"- {line}" for line in header_lines(report)),
        "",
        markdown_table(report),
    ]
    parts += ["", NOTES]
    if report.warnings:
        parts += ["", "Warnings:", *(f"- {w}" for w in report.warnings)]
    for fig in figures:
        parts += ["", f"![{Path(fig).stem}]({Path(fig).name})"]
    return "\n".join(parts) + "\n"


def _jsonable(v: Any) -> Any:
    """JSON has no NaN / inf: write them as strings, as metrics.jsonl does."""
    if hasattr(v, "item") and not isinstance(v, (list, tuple, dict)):
        v = v.item()  # numpy scalars
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def _stat(mean_and_std: tuple[float, float | None]) -> dict:
    return {"mean": mean_and_std[0], "std": mean_and_std[1]}


def to_json(report: Report) -> dict:
    groups = []
    for g in report.groups:
        groups.append(
            {
                "label": g.label,
                "values": {c.key: v for c, v in zip(report.columns, g.cells, strict=True)},
                "baseline": g.baseline,
                "n_seeds": g.n,
                "final_val_loss": _stat(g.final),
                "best_val_loss": _stat(g.best),
                "final_tokens": g.final_tokens,
                "tokens_to_target": {
                    "reached": len(g.reached),
                    "of": g.n,
                    **_stat(mean_std(g.reached) if g.reached else (math.nan, None)),
                    "mean_curve": g.tokens_to_target_curve,
                },
                "speedup": g.speedup,
                "speedup_note": g.speedup_note or None,
                "effective_data": {
                    "tokens": g.effective_tokens,
                    "speedup": g.effective_speedup,
                    "extrapolated": g.extrapolated,
                    "note": g.effective_note or None,
                },
                "welch": (
                    {"t": g.welch.t, "df": g.welch.df, "p": g.welch.p, "significant": g.welch.significant}
                    if g.welch
                    else {"note": g.welch_note}
                ),
                "runs": [vars(r) for r in g.runs],
            }
        )
    fit = (
        {k: getattr(report.fit, k) for k in ("a", "b", "c", "n_points", "rmse", "max_tokens")}
        if report.fit
        else {"error": report.fit_note}
    )
    return _jsonable(
        {
            "roots": [str(r) for r in report.roots],
            "columns": [c.key for c in report.columns],
            "common": report.common,
            "baseline": {"index": report.baseline, "label": report.groups[report.baseline].label,
                         "how": report.baseline_note},
            "target": {"loss": report.target, "source": report.target_note},
            "fit": {"formula": "L(D) = a * D^-b + c", **fit},
            "alpha": ALPHA,
            "groups": groups,
            "warnings": report.warnings,
        }
    )  # fmt: skip


def write_report(report: Report, out: Path) -> list[Path]:
    """report.md, report.json, report_curves.png/.pdf and, for exactly two varying keys, a heatmap."""
    out.mkdir(parents=True, exist_ok=True)
    curves = [
        GroupCurves(g.label or "all runs", g.val, g.train, baseline=g.baseline, n_seeds=g.n)
        for g in report.groups
    ]
    figures = plot_groups(out / "report_curves.png", curves, report.target, title=report.common or None)
    if len(report.columns) == 2:
        figures += _heatmap(report, out / "report_heatmap.png")
    md, js = out / "report.md", out / "report.json"
    md.write_text(render_markdown(report, [f for f in figures if f.suffix == ".png"]))
    js.write_text(json.dumps(to_json(report), indent=2) + "\n")
    return [md, js, *figures]


def _heatmap(report: Report, path: Path) -> list[Path]:
    rows_col, cols_col = report.columns
    cells: dict[tuple[str, str], list[float]] = {}
    for g in report.groups:
        r, c = (v if v is not None else "-" for v in g.cells)
        cells.setdefault((r, c), []).extend(x.final_val_loss for x in g.runs)
    rows = sorted({k[0] for k in cells}, key=lambda v: value_key(None if v == "-" else v))
    cols = sorted({k[1] for k in cells}, key=lambda v: value_key(None if v == "-" else v))
    return heatmap(
        path,
        rows_col.key,
        cols_col.key,
        cells,
        "mean final val loss",
        rows,
        cols,
        title="mean final val loss ± std over seeds" + (f"\n{report.common}" if report.common else ""),
        pdf=True,
    )
