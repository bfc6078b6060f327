"""A research report over one or more sweeps: per setting, seeds pooled, compared to a baseline.

build_report() does the reading, grouping and statistics (raising UserError on bad input);
markdown_table() / comparison_table() / render_markdown() / to_json() present it; write_report()
writes report.md, report.json and the figures. Every number is about one metric of metrics.jsonl
(--metric, default val/loss), better in the direction mars.analysis.metric decides. Definitions
(docs/research.md has the longer story):

* final / best value: the last / best logged value of each run; mean and sample std (ddof=1) over
  the group's seeds;
* tokens to target, per run: where its curve first reaches the target, linear in tokens between
  evaluations; runs that never reach it are counted ("2/3 reached") and left out of the mean;
* speedup: the baseline's tokens to target over the group's, both read off the seed-mean curves
  (so it exists even when a seed stops short of the target, which with the default target - the
  baseline's own mean final value - happens to about half of the baseline's seeds);
* effective-data speedup (metrics where lower is better): L(D) = a D^-b + c fitted to the
  baseline's mean curve; a group's mean final value L needs D_eff = ((L - c) / a)^(-1/b) baseline
  tokens; speedup = D_eff / the group's tokens;
* 95% intervals of both speedups: the jackknife over seeds (mars.analysis.intervals), paired where
  the group and the baseline ran the same seeds;
* the comparison of final values with the baseline's (mars.analysis.significance): the paired
  t-test where the seeds match, else Welch's; Holm's correction over all groups compared with the
  baseline; the smallest difference the seeds detect with 80% power, and the seeds the observed
  difference would need;
* time to target (mars.analysis.time_to_target): steps, tokens and training seconds to the target per
  run and per setting (median over seeds; mean and 95% interval when every seed gets there), the
  one-sided test that a setting reaches it, and the ratio of steps and of seconds against the
  baseline's with Holm's correction;
* wall-clock: each setting's throughput (tokens per training second) and step time split into
  forward-backward and optimizer step, and the speedups per token and per second (speedup in data
  times the ratio of throughputs), with the hardware the seconds were measured on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mars.analysis.groups import (
    Group,
    at_sweep_length,
    check_comparable,
    duplicate_seeds,
    group_runs,
    pairing,
    parse_baseline,
    seeds_of,
    select_baseline,
    sort_groups,
    value_key,
)
from mars.analysis.intervals import Interval, jackknife_interval
from mars.analysis.labels import Column, cell, common_description, label, varying_columns
from mars.analysis.metric import Metric, metric_of
from mars.analysis.plots import GroupCurves, heatmap, plot_groups
from mars.analysis.runs import Run, load_runs, require_metric
from mars.analysis.significance import ALPHA, LEVEL, MAX_SEEDS, POWER, Comparison, Welch, compare, holm, welch
from mars.analysis.speedups import Speedups
from mars.analysis.stats import Band, PowerLaw, mean_curve, mean_std, tokens_to_target
from mars.errors import UserError
from mars.files import write_atomic
from mars.metrics_jsonl import jsonable

if TYPE_CHECKING:
    from mars.analysis.time_to_target import SettingTime, TimeRatio


@dataclass
class RunResult:
    path: str
    seed: Any
    data_seed: Any
    final: float  # the metric's last value
    best: float  # its best value
    final_tokens: float  # tokens at its last value
    tokens_to_target: float | None


@dataclass
class GroupResult:
    label: str
    cells: list[str | None]
    runs: list[RunResult]
    bands: list[Band | None]  # seed-mean curves of the figure's panels: the metric, then train (or val) loss
    baseline: bool = False
    tokens_to_target_curve: float | None = None  # crossing of the seed-mean curve
    speedup: float | None = None
    speedup_note: str = ""
    speedup_ci: Interval | None = None
    speedup_ci_note: str = ""
    effective_tokens: float | None = None
    effective_speedup: float | None = None
    effective_note: str = ""
    extrapolated: bool = False
    effective_ci: Interval | None = None
    effective_ci_note: str = ""
    welch: Welch | None = None  # Welch's test, always (report.json "welch", as before pairing)
    welch_note: str = ""
    comparison: Comparison | None = None  # the test the verdict uses: paired where the seeds match
    comparison_note: str = ""
    time: SettingTime | None = None  # time to target (mars.analysis.time_to_target)
    steps_ratio: TimeRatio | str = "baseline"  # baseline's steps to target / this group's
    seconds_ratio: TimeRatio | str = "baseline"
    split_ms: tuple[float, float, float] | None = None  # mean ms per step: whole, forward-backward, optimizer

    @property
    def n(self) -> int:
        return len(self.runs)

    @property
    def final(self) -> tuple[float, float | None]:
        return mean_std([r.final for r in self.runs])

    @property
    def best(self) -> tuple[float, float | None]:
        return mean_std([r.best for r in self.runs])

    @property
    def final_tokens(self) -> float:
        return mean_std([r.final_tokens for r in self.runs])[0]

    @property
    def reached(self) -> list[float]:
        return [r.tokens_to_target for r in self.runs if r.tokens_to_target is not None]


@dataclass
class Report:
    roots: list[Path]
    metric: Metric
    columns: list[Column]
    common: str
    groups: list[GroupResult]
    baseline: int
    baseline_note: str
    target: float
    target_note: str
    fit: PowerLaw | None
    fit_note: str
    paired: bool  # pairing allowed (not --unpaired)
    panels: list[Metric] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    lineage: list[str] = field(default_factory=list)  # forks and runs begun from other weights
    hardware: list[str] = field(default_factory=list)  # what the runs' seconds were measured on
    time_target: float = math.nan  # of time to target: --target, or the baseline's median final value
    time_target_note: str = ""

    @property
    def n_runs(self) -> int:
        return sum(g.n for g in self.groups)

    @property
    def n_compared(self) -> int:
        return sum(g.comparison is not None for g in self.groups)


def build_report(
    roots: Sequence[Path],
    baseline: Sequence[str] = (),
    target: float | None = None,
    best: bool = False,
    metric: str = "val/loss",
    direction: str | None = None,
    paired: bool = True,
) -> Report:
    """Read, check, group and compare the runs under `roots`; UserError on bad input.

    metric: the metrics.jsonl key compared; direction: "lower" / "higher" to override which way it
    is better (mars.analysis.metric); paired=False: Welch's test and unpaired intervals everywhere.
    """
    parse_baseline(baseline)  # a malformed --baseline fails before anything is read
    m = metric_of(metric, direction)
    if target is not None and not math.isfinite(target):
        raise UserError(
            f"--target {target} is not a finite number: give the value to reach, e.g. --target 3.28, or "
            "leave it out (the baseline's mean final value; for time to target its median)"
        )
    runs, extended = at_sweep_length(load_runs(list(roots)))
    require_metric(runs, m.key)
    check_comparable(runs)
    groups = group_runs(runs)
    columns = varying_columns([g.item for g in groups])
    groups = sort_groups(groups, columns)
    labels = [label(columns, g.item) for g in groups]
    base_index, base_note = select_baseline(groups, baseline, columns, labels, best=best, metric=m)
    second = metric_of("val/loss" if m.key == "train/loss" else "train/loss")
    panels = [m, second] if any(second.key in r.metrics for r in runs) else [m]  # the figure's panels
    results = [_group_result(g, text, columns, panels) for g, text in zip(groups, labels, strict=True)]
    base, base_runs = results[base_index], groups[base_index].runs
    base.baseline = True
    speedups = Speedups(m, target)
    target_value = speedups.target(base_runs)
    if target is None:
        target_note = f"the baseline's mean final {m.title}"
        if not math.isfinite(target_value):
            raise UserError(f"the baseline's final {m.title} is not finite (diverged?): pass --target VALUE")
    else:
        target_note = "--target"
    fit = speedups.fit(base_runs)
    for g, group in zip(results, groups, strict=True):
        for r, run in zip(g.runs, group.runs, strict=True):
            r.tokens_to_target = tokens_to_target(run.curve(m.key), target_value, m.higher_is_better)
        g.tokens_to_target_curve = speedups.crossing(group.runs, target_value)
    for g, group in zip(results, groups, strict=True):
        _compare(g, group.runs, base_runs, speedups, m, paired)
    compared = [g for g in results if g.comparison is not None]
    for g, p in zip(compared, holm([g.comparison.p for g in compared]), strict=True):
        g.comparison.p_holm = p
    time_target = target if target is not None else float(np.median([r.final(m.key) for r in base_runs]))
    _times(results, groups, base_index, time_target, m, paired)
    return Report(
        roots=list(roots),
        metric=m,
        columns=columns,
        common=common_description(columns, [g.item for g in groups]),
        groups=results,
        baseline=base_index,
        baseline_note=base_note,
        target=float(target_value),
        target_note=target_note,
        fit=None if isinstance(fit, str) else fit,
        fit_note=fit if isinstance(fit, str) else "",
        paired=paired,
        panels=panels,
        warnings=[*extended, *_warnings(groups, results, m)],
        lineage=[line for r in runs if (line := r.lineage_line())],
        hardware=sorted({h for r in runs for h in r.hardware}),
        time_target=time_target,
        time_target_note="--target" if target is not None else f"the baseline's median final {m.title}",
    )


def _times(
    results: list[GroupResult], groups: list[Group], base_index: int, target: float, m: Metric, paired: bool
) -> None:
    """Each group's time to target, its ratios to the baseline's (Holm over the steps ratios) and its
    mean step time split."""
    from mars.analysis.time_to_target import setting_time, time_ratio

    base_runs = groups[base_index].runs
    for g, group in zip(results, groups, strict=True):
        g.time = setting_time(group.runs, m.key, target, m.higher_is_better)
        g.split_ms = _split_ms(group.runs)
    base = results[base_index].time
    for g, group in zip(results, groups, strict=True):
        if g.baseline:
            continue
        order, _ = pairing(group.runs, base_runs) if paired else ([], "")
        mine = g.time
        if order:
            mine = setting_time([group.runs[i] for i in order], m.key, target, m.higher_is_better)
        g.steps_ratio = time_ratio(mine, base, "steps", bool(order))
        g.seconds_ratio = time_ratio(mine, base, "seconds", bool(order))
    ratios = [g.steps_ratio for g in results if not isinstance(g.steps_ratio, str)]
    for r, p in zip(ratios, holm([r.comparison.p for r in ratios]), strict=True):
        r.p_holm = p


def _split_ms(runs: Sequence[Run]) -> tuple[float, float, float] | None:
    """The mean over runs of each run's mean ms_per_step, ms_forward_backward and ms_optimizer."""
    keys = ("ms_per_step", "ms_forward_backward", "ms_optimizer")
    per_run = []
    for r in runs:
        values = [[p.value for p in r.metrics.get(k, ()) if math.isfinite(p.value)] for k in keys]
        if not all(values):
            return None
        per_run.append([sum(v) / len(v) for v in values])
    return tuple(float(sum(col) / len(col)) for col in zip(*per_run, strict=True)) if per_run else None


def _group_result(
    group: Group, text: str, columns: Sequence[Column], panels: Sequence[Metric]
) -> GroupResult:
    key = panels[0].key
    runs = [
        RunResult(
            path=str(r.path),
            seed=seeds_of(r)[0],
            data_seed=seeds_of(r)[1],
            final=r.final(key),
            best=panels[0].best([v for _, v in r.curve(key)]),
            final_tokens=r.final_tokens(key),
            tokens_to_target=None,
        )
        for r in group.runs
    ]
    bands = [
        mean_curve([r.curve(p.key) for r in group.runs])
        if all(p.key in r.metrics for r in group.runs)
        else None
        for p in panels
    ]
    return GroupResult(label=text, cells=[cell(c, group.item) for c in columns], runs=runs, bands=bands)


def _compare(
    g: GroupResult,
    group: list[Run],
    base_runs: list[Run],
    speedups: Speedups,
    m: Metric,
    paired: bool,
) -> None:
    """Fill in the group's speedups, their intervals and its tests against the baseline."""
    value = speedups.speedup(group, base_runs)
    g.speedup, g.speedup_note = (None, value) if isinstance(value, str) else (value, "")
    result = speedups.effective(group, base_runs)
    if isinstance(result, str):
        g.effective_note = result
    else:
        g.effective_tokens, g.effective_speedup = result
        fit = speedups.fit(base_runs)
        g.extrapolated = bool(g.effective_tokens > fit.max_tokens * (1 + 1e-9))
    if g.baseline:
        g.welch_note = g.comparison_note = g.speedup_ci_note = g.effective_ci_note = "baseline"
        return
    order, why_not = pairing(group, base_runs) if paired else ([], "--unpaired")
    mine = [group[i] for i in order] if order else group
    if g.speedup is None:
        g.speedup_ci_note = "no estimate"
    else:
        g.speedup_ci, g.speedup_ci_note = _jackknife(speedups.speedup, mine, base_runs, bool(order))
    if g.effective_speedup is None:
        g.effective_ci_note = "no estimate"
    else:
        g.effective_ci, g.effective_ci_note = _jackknife(
            speedups.effective_speedup, mine, base_runs, bool(order)
        )
    finals = [r.final(m.key) for r in mine]
    base_finals = [r.final(m.key) for r in base_runs]
    result = welch(finals, base_finals)
    g.welch, g.welch_note = (None, result) if isinstance(result, str) else (result, "")
    comparison = compare(finals, base_finals, paired=bool(order))
    if isinstance(comparison, str):
        g.comparison_note = comparison
    else:
        g.comparison = comparison
        g.comparison_note = "" if order else why_not


def _jackknife(estimate, group: list[Run], base: list[Run], paired: bool) -> tuple[Interval | None, str]:
    """The jackknife interval of estimate(group runs, baseline runs), or (None, why there is none)."""
    interval = jackknife_interval(
        lambda keep, keep_base: estimate([group[i] for i in keep], [base[j] for j in keep_base]),
        len(group),
        len(base),
        paired=paired,
    )
    return (None, interval) if isinstance(interval, str) else (interval, "")


def _warnings(groups: Sequence[Group], results: Sequence[GroupResult], m: Metric) -> list[str]:
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
                f"{', '.join(short)} stopped early (killed?), so its final value is from earlier in training"
            )
        for r in res.runs:
            if not math.isfinite(r.final):
                out.append(f"{r.path}: final {m.title} is {r.final} (diverged?)")
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


def _interval(ci: Interval | None, note: str) -> str:
    if ci is not None:
        return f"{ci.low:.2f}x - {ci.high:.2f}x"
    return "-" if note in ("baseline", "no estimate") else f"n/a ({note})"


def _headers(report: Report) -> tuple[str, ...]:
    title = report.metric.title
    return (
        "seeds",
        f"final {title}",
        f"best {title}",
        "reached target",
        "tokens to target (per run)",
        "tokens to target (mean curve)",
        "speedup",
        "effective-data speedup",
        f"speedup {LEVEL:.0%} CI",
        f"effective-data {LEVEL:.0%} CI",
    )


def _label_cells(g: GroupResult) -> list[str]:
    cells = [v if v is not None else "-" for v in g.cells] or ["all runs"]
    if g.baseline:
        cells[0] = f"**{cells[0]}**"
    return cells


def _table(keys: list[str], headers: Sequence[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join([*keys, *headers]) + " |", "|" + "---|" * len(keys) + "---:|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_table(report: Report) -> str:
    """One row per group: its values in the varying columns, then what it did and its speedups."""
    keys = [c.header for c in report.columns] or ["group"]
    rows = [
        [
            *_label_cells(g),
            str(g.n),
            _pm(*g.final),
            _pm(*g.best),
            f"{len(g.reached)}/{g.n}",
            _tokens_pm(g.reached),
            _tokens(g.tokens_to_target_curve),
            _speedup(g),
            _effective(g),
            _interval(g.speedup_ci, g.speedup_ci_note),
            _interval(g.effective_ci, g.effective_ci_note),
        ]
        for g in report.groups
    ]
    return _table(keys, _headers(report), rows)


def verdict(report: Report, g: GroupResult) -> str:
    c = g.comparison
    if c is None:
        return "-"
    if not c.significant:
        return "not resolved"
    return "better" if report.metric.better(c.difference) else "worse"


def _seeds_needed(c: Comparison) -> str:
    if c.seeds_needed is not None:
        return str(c.seeds_needed)
    return "- (no difference)" if c.difference == 0 else f"> {MAX_SEEDS:,}"


def comparison_table(report: Report) -> str:
    """One row per group other than the baseline: the test, the difference, p, Holm's p, the verdict,
    and what the seeds could detect."""
    keys = [c.header for c in report.columns] or ["group"]
    title = report.metric.title
    headers = (
        "test",
        f"difference in final {title} ({LEVEL:.0%} CI)",
        "p",
        "p (Holm)",
        "verdict",
        f"detectable difference ({POWER:.0%} power)",
        f"seeds needed ({POWER:.0%} power)",
    )
    rows = []
    for g in report.groups:
        if g.baseline:
            continue
        c = g.comparison
        if c is None:
            rows.append([*_label_cells(g), f"n/a ({g.comparison_note})", *["-"] * (len(headers) - 1)])
            continue
        test = c.test if not g.comparison_note else f"{c.test} ({g.comparison_note})"
        rows.append(
            [
                *_label_cells(g),
                f"{test}, n={c.n}" if c.test == "paired" else f"{test}, n={c.n} vs {c.n_baseline}",
                f"{c.difference:+.4f} ({c.ci[0]:+.4f} to {c.ci[1]:+.4f})",
                f"{c.p:.3g}",
                f"{c.p_holm:.3g}" if c.p_holm is not None else "-",
                verdict(report, g),
                f"{c.detectable:.4f}",
                _seeds_needed(c),
            ]
        )
    return _table(keys, headers, rows)


def header_lines(report: Report) -> list[str]:
    roots = ", ".join(f"`{r}`" for r in report.roots)
    m = report.metric
    lines = [
        f"Runs: {report.n_runs} in {len(report.groups)} group(s) under {roots}"
        + (f"; shared: {report.common}" if report.common else ""),
        f"Metric: {m.key} ({m.direction} is better; {m.why})",
        f"Baseline (bold): {report.baseline_note}",
        f"Target {m.title}: {report.target:.4f} ({report.target_note})",
    ]
    if report.fit is not None:
        f = report.fit
        lines.append(
            f"Fit of the baseline's mean curve: L(D) = a * D^-b + c with a = {f.a:.4g}, b = {f.b:.4g}, "
            f"c = {f.c:.4g} ({f.n_points} points, RMSE {f.rmse:.2g})"
        )
    else:
        lines.append(f"Fit of the baseline's mean curve: failed ({report.fit_note})")
    return lines


def comparison_lines(report: Report) -> list[str]:
    m = report.n_compared
    pairing = (
        "paired t-test where a group ran the baseline's seeds, else Welch's test"
        if report.paired
        else ("Welch's test (--unpaired)")
    )
    return [
        f"Against the baseline: {pairing}; p (Holm) corrected over the {m} comparison(s) with the baseline, "
        f"verdict at p (Holm) < {ALPHA:g}; detectable difference and seeds needed at {POWER:.0%} power, "
        f"alpha {ALPHA:g}, from the observed spread."
    ]


NOTES = """\
- seeds: runs pooled into the group (same settings, different train.seed / train.data_seed).
- final / best: the metric's last and best value per run, mean ± sample std over seeds (`-`: one
  seed).
- reached target / tokens to target (per run): runs whose curve gets to the target, and where
  (interpolated linearly in tokens between evaluations), mean ± std over the runs that reach it.
- tokens to target (mean curve): where the seed-mean curve reaches the target.
- speedup: the baseline's tokens to target / the group's, both from the mean curves.
- effective-data speedup: D_eff / the group's tokens, where D_eff = L^-1(group's mean final value)
  on the fit above: the baseline tokens that value would take (`*`: beyond the tokens the fit saw).
- 95% CI of the speedups: jackknife over seeds (leave one seed out, recompute the speedup and the
  default target; log scale; Student's t), seeds left out of both sides together where paired.
- test: `paired` when the group ran exactly the baseline's seeds (train.seed and data seed), each
  once: the per-seed differences are tested (scipy.stats.ttest_rel), n pairs; otherwise `Welch`
  (scipy.stats.ttest_ind, equal_var=False), with the reason. `--unpaired` uses Welch everywhere.
- difference: mean final value of the group minus the baseline's (paired: the mean of the per-seed
  differences), with its 95% t confidence interval.
- p: two-sided, uncorrected. p (Holm): Holm's step-down correction over all m groups compared with
  the baseline: sort the m p-values, multiply the k-th smallest by m - k + 1, keep them
  non-decreasing, cap at 1. A verdict is `better` / `worse` only where p (Holm) < 0.05, which
  keeps the chance of any false verdict among the m at most 5%; otherwise `not resolved` (the seeds
  cannot tell; it does not mean equal).
- detectable difference: the smallest true difference this test, with these seeds and the observed
  spread, finds with 80% power at alpha 0.05 (uncorrected). seeds needed: seeds per side (pairs when
  paired) for 80% power at the observed difference, if the spread stays as observed."""


def _count(x: float | None, digits: int = 0) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:,.{digits}f}"


def _seconds(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else (f"{x:,.0f} s" if x >= 100 else f"{x:.3g} s")


def _mean_ci_cell(value: tuple[float, float, float] | None, fmt) -> str:
    if value is None:
        return "-"
    mean, low, high = value
    return fmt(mean) if not math.isfinite(low) else f"{fmt(mean)} ({fmt(low)} - {fmt(high)})"


def _ratio_cell(r: TimeRatio | str, holm: bool = False) -> str:
    if isinstance(r, str):
        return "-" if r == "baseline" else r
    p = f", p {r.comparison.p:.3g}" + (f" / Holm {r.p_holm:.3g}" if holm and r.p_holm is not None else "")
    return f"{r.ratio:.2f}x ({r.low:.2f}x - {r.high:.2f}x{p})"


def _reach_cell(g: GroupResult) -> str:
    t = g.time.reach
    if isinstance(t, str):
        return f"- ({t})"
    return f"{'yes' if t.reached else 'not shown'} (p {t.p:.3g})"


def time_table(report: Report) -> str:
    """Per group: how many seeds reach the target, their median (and mean with its 95% interval) steps,
    tokens and seconds to it, the one-sided test that the setting reaches it, and the ratios of steps and
    seconds against the baseline's."""
    keys = [c.header for c in report.columns] or ["group"]
    headers = (
        "seeds reached",
        "steps (median)",
        "steps, mean (95% CI)",
        "tokens (median)",
        "seconds (median)",
        "seconds, mean (95% CI)",
        "target reached? (one-sided)",
        "steps: baseline / this (95% CI)",
        "seconds: baseline / this (95% CI)",
    )
    rows = []
    for g in report.groups:
        t = g.time
        cells = [
            f"{t.reached}/{len(t.crossings)}",
            _count(t.median("steps")) if t.median("steps") is not None else "not reached",
            _mean_ci_cell(t.mean_ci("steps"), _count),
            _tokens(t.median("tokens")) if t.median("tokens") is not None else "not reached",
            _seconds(t.median("seconds")) if t.median("steps") is not None else "not reached",
            _mean_ci_cell(t.mean_ci("seconds"), _seconds),
            _reach_cell(g),
            _ratio_cell(g.steps_ratio, holm=True),
            _ratio_cell(g.seconds_ratio),
        ]
        rows.append([*_label_cells(g), *cells])
    return _table(keys, headers, rows)


def per_second(report: Report, g: GroupResult, speedup: float | None) -> float | None:
    """A speedup in data times the ratio of throughputs (tokens per training second) to the baseline's."""
    base = report.groups[report.baseline].time
    if speedup is None or g.time is None or g.time.throughput is None or base.throughput is None:
        return None
    return speedup * g.time.throughput / base.throughput


def wall_clock_table(report: Report) -> str:
    """Per group: throughput, the step time and its split, and the speedups per token and per second."""
    keys = [c.header for c in report.columns] or ["group"]
    headers = (
        "tokens/s",
        "ms/step (forward-backward + optimizer)",
        "speedup per token",
        "speedup per second",
        "effective-data speedup per token",
        "effective-data speedup per second",
    )
    rows = []
    for g in report.groups:
        ms = g.split_ms
        split = "-" if ms is None else f"{ms[0]:.4g} ({ms[1]:.4g} + {ms[2]:.4g})"
        ps, pe = per_second(report, g, g.speedup), per_second(report, g, g.effective_speedup)
        cells = [
            _count(g.time.throughput),
            split,
            _speedup(g),
            "-" if ps is None else f"{ps:.2f}x",
            _effective(g),
            "-" if pe is None else f"{pe:.2f}x",
        ]
        rows.append([*_label_cells(g), *cells])
    return _table(keys, headers, rows)


def time_lines(report: Report) -> list[str]:
    m = report.metric
    hw = report.hardware
    where = (
        f"measured on {hw[0]}"
        if len(hw) == 1
        else (
            f"measured on {len(hw)} kinds of hardware ({'; '.join(hw)}): the per-second figures compare "
            "machines as well as settings"
            if hw
            else "no run names its hardware (logged before the harness recorded it)"
        )
    )
    return [
        f"Time to the target {m.title} {report.time_target:.4f} ({report.time_target_note}: its seeds' "
        "median time then reaches it by construction; the tokens-to-target speedup above reads the seed-mean "
        "curves, hence its mean), per run interpolated "
        "linearly in steps between evaluations (seconds: the training seconds logged there, evaluations "
        "and compilation left out); per setting the median over seeds, a seed that never gets there "
        f"counting as infinitely slow ('not reached', never a number); the one-sided t-test of the final "
        f"values against the target (reached at p < {ALPHA:g}); ratios from the per-seed log times, paired "
        "where the seeds match, Holm over the settings.",
        f"Seconds {where}. Speedup per second = speedup in data x (tokens/s / the baseline's tokens/s).",
    ]


def render_markdown(
    report: Report, figures: Sequence[str] = (), sections: Sequence[tuple[str, Sequence[str]]] = ()
) -> str:
    """report.md; `sections`: (title, lines) added after the notes (e.g. report.py --edges)."""
    parts = [
        "# Sweep report",
        "",
        *(f"- {line}" for line in header_lines(report)),
        "",
        markdown_table(report),
    ]
    if report.n_compared or len(report.groups) > 1:
        parts += ["", *comparison_lines(report), "", comparison_table(report)]
    if report.groups[0].time is not None:
        parts += ["", "## Time to target and wall-clock", "", *(f"- {line}" for line in time_lines(report))]
        parts += ["", time_table(report), "", wall_clock_table(report)]
    parts += ["", NOTES]
    if report.warnings:
        parts += ["", "Warnings:", *(f"- {w}" for w in report.warnings)]
    if report.lineage:  # a fork's own metrics begin after the step it forked at
        parts += ["", "Lineage:", *(f"- {line}" for line in report.lineage)]
    for title, lines in sections:
        parts += ["", f"{title}:", *(f"- {line}" for line in lines)]
    for fig in figures:
        parts += ["", f"![{Path(fig).stem}]({Path(fig).name})"]
    return "\n".join(parts) + "\n"


def _stat(mean_and_std: tuple[float, float | None]) -> dict:
    return {"mean": mean_and_std[0], "std": mean_and_std[1]}


def _interval_json(ci: Interval | None, note: str) -> dict:
    if ci is None:
        return {"note": note or None}
    return {"low": ci.low, "high": ci.high, "level": ci.level, "method": ci.method, "df": ci.df}


def _comparison_json(report: Report, g: GroupResult) -> dict:
    c = g.comparison
    if c is None:
        return {"note": g.comparison_note}
    return {
        "test": c.test,
        "why": g.comparison_note or None,
        "n": c.n,
        "n_baseline": c.n_baseline,
        "difference": c.difference,
        "ci": list(c.ci),
        "se": c.se,
        "t": c.t,
        "df": c.df,
        "p": c.p,
        "p_holm": c.p_holm,
        "significant": c.significant,
        "verdict": verdict(report, g),
        "per_seed_differences": c.differences or None,
        "detectable_difference": c.detectable,
        "seeds_needed": c.seeds_needed,
    }


def _ratio_json(r: TimeRatio | str) -> dict:
    if isinstance(r, str):
        return {"note": r}
    c = r.comparison
    return {"ratio": r.ratio, "low": r.low, "high": r.high, "test": c.test, "p": c.p, "p_holm": r.p_holm}


def _time_json(report: Report, g: GroupResult) -> dict | None:
    t = g.time
    if t is None:
        return None
    reach = t.reach
    return {
        "target": report.time_target,
        "target_source": report.time_target_note,
        "per_run": [None if c is None else {"steps": c.steps, "tokens": c.tokens, "seconds": c.seconds}
                    for c in t.crossings],
        "reached": t.reached,
        "of": len(t.crossings),
        **{f"{k}_median": t.median(k) for k in ("steps", "tokens", "seconds")},
        **{f"{k}_mean_ci": t.mean_ci(k) for k in ("steps", "seconds")},
        "reach_test": {"note": reach} if isinstance(reach, str) else {
            "n": reach.n, "mean": reach.mean, "t": reach.t, "p": reach.p, "reached": reach.reached},
        "steps_ratio": _ratio_json(g.steps_ratio),
        "seconds_ratio": _ratio_json(g.seconds_ratio),
        "tokens_per_s": t.throughput,
        "ms_per_step": None if g.split_ms is None else dict(
            zip(("step", "forward_backward", "optimizer"), g.split_ms, strict=True)),
        "speedup_per_second": per_second(report, g, g.speedup),
        "effective_speedup_per_second": per_second(report, g, g.effective_speedup),
    }  # fmt: skip


def to_json(report: Report) -> dict:
    legacy = report.metric.key == "val/loss"  # readers written before --metric
    groups = []
    for g in report.groups:
        final, best = _stat(g.final), _stat(g.best)
        runs = []
        for r in g.runs:
            run = {"path": r.path, "seed": r.seed, "data_seed": r.data_seed, "final": r.final, "best": r.best}
            if legacy:
                run.update(final_val_loss=r.final, best_val_loss=r.best)
            runs.append({**run, "final_tokens": r.final_tokens, "tokens_to_target": r.tokens_to_target})
        groups.append(
            {
                "label": g.label,
                "values": {c.key: v for c, v in zip(report.columns, g.cells, strict=True)},
                "baseline": g.baseline,
                "n_seeds": g.n,
                "final": final,
                "best": best,
                **({"final_val_loss": final, "best_val_loss": best} if legacy else {}),
                "final_tokens": g.final_tokens,
                "tokens_to_target": {
                    "reached": len(g.reached),
                    "of": g.n,
                    **_stat(mean_std(g.reached) if g.reached else (math.nan, None)),
                    "mean_curve": g.tokens_to_target_curve,
                },
                "speedup": g.speedup,
                "speedup_note": g.speedup_note or None,
                "speedup_interval": _interval_json(g.speedup_ci, g.speedup_ci_note),
                "effective_data": {
                    "tokens": g.effective_tokens,
                    "speedup": g.effective_speedup,
                    "extrapolated": g.extrapolated,
                    "note": g.effective_note or None,
                    "interval": _interval_json(g.effective_ci, g.effective_ci_note),
                },
                "welch": (
                    {"t": g.welch.t, "df": g.welch.df, "p": g.welch.p, "significant": g.welch.significant}
                    if g.welch
                    else {"note": g.welch_note}
                ),
                "comparison": _comparison_json(report, g),
                "time_to_target": _time_json(report, g),
                "runs": runs,
            }
        )
    fit = (
        {k: getattr(report.fit, k) for k in ("a", "b", "c", "n_points", "rmse", "max_tokens")}
        if report.fit
        else {"error": report.fit_note}
    )
    m = report.metric
    return jsonable(
        {
            "roots": [str(r) for r in report.roots],
            "metric": {"key": m.key, "higher_is_better": m.higher_is_better, "direction_from": m.why},
            "columns": [c.key for c in report.columns],
            "common": report.common,
            "baseline": {"index": report.baseline, "label": report.groups[report.baseline].label,
                         "how": report.baseline_note},
            "target": {"value": report.target, "loss": report.target, "source": report.target_note},
            "fit": {"formula": "L(D) = a * D^-b + c", **fit},
            "alpha": ALPHA,
            "power": POWER,
            "level": LEVEL,
            "correction": {"method": "holm", "comparisons": report.n_compared},
            "paired": report.paired,
            "groups": groups,
            "warnings": report.warnings,
            "lineage": report.lineage,
            "hardware": report.hardware,
        }
    )  # fmt: skip


def write_report(report: Report, out: Path, sections: Sequence[tuple[str, Sequence[str]]] = ()) -> list[Path]:
    """report.md, report.json, report_curves.png/.pdf and, for exactly two varying keys, a heatmap;
    `sections` go into report.md (render_markdown)."""
    out.mkdir(parents=True, exist_ok=True)
    curves = [
        GroupCurves(g.label or "all runs", g.bands, baseline=g.baseline, n_seeds=g.n) for g in report.groups
    ]
    figures = plot_groups(
        out / "report_curves.png",
        curves,
        report.target,
        title=report.common or None,
        panels=[p.axis_label for p in report.panels],
        higher_is_better=report.metric.higher_is_better,
    )
    if len(report.columns) == 2:
        figures += _heatmap(report, out / "report_heatmap.png")
    md, js = out / "report.md", out / "report.json"
    write_atomic(md, render_markdown(report, [f for f in figures if f.suffix == ".png"], sections))
    write_atomic(js, json.dumps(to_json(report), indent=2) + "\n")
    return [md, js, *figures]


def _heatmap(report: Report, path: Path) -> list[Path]:
    rows_col, cols_col = report.columns
    cells: dict[tuple[str, str], list[float]] = {}
    for g in report.groups:
        r, c = (v if v is not None else "-" for v in g.cells)
        cells.setdefault((r, c), []).extend(x.final for x in g.runs)
    rows = sorted({k[0] for k in cells}, key=lambda v: value_key(None if v == "-" else v))
    cols = sorted({k[1] for k in cells}, key=lambda v: value_key(None if v == "-" else v))
    what = f"mean final {report.metric.title}"
    return heatmap(
        path,
        rows_col.key,
        cols_col.key,
        cells,
        what,
        rows,
        cols,
        title=f"{what} ± std over seeds" + (f"\n{report.common}" if report.common else ""),
        pdf=True,
        higher_is_better=report.metric.higher_is_better,
    )
