"""The study's report: report.py's verdict on the finals, and what only the study knows.

Written into STUDY_DIR/report/:

    report.md, report.json, report_curves.png   exactly what `python scripts/report.py` writes for the
                                                same run dirs: each arm's best finalist (its seeds), the
                                                baseline arm's as the baseline (the command is printed in
                                                study.md); paired t-tests, Holm, intervals, power
    study.md, study.json                        the study: the verdict per arm, marked "not at the
                                                optimum" where an edge remains; the edges and the rounds
                                                they added; the budget each arm spent (trials, tokens,
                                                wall time, the driver's overhead); the best configs;
                                                the sensitivity table; every diverged or failed trial
    search_ARM.png, sensitivity.png             the figures (mars.study.figures)
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from mars.analysis.labels import format_value
from mars.analysis.stats import mean_std
from mars.entry import hydra_value
from mars.files import write_atomic
from mars.metrics_jsonl import jsonable
from mars.study.errors import StudyError
from mars.study.figures import bins_for, profile, search_figure, sensitivity_figure
from mars.study.finals import best_finalist, ranked
from mars.study.spec import public_spec
from mars.study.storage import shown

REPORT_DIR = "report"


@dataclass
class ArmReport:
    name: str
    optimizer: str
    rounds: list
    search: list
    final: list
    plan: list | None
    edges: list = field(default_factory=list)  # edges left at the end
    limits: list = field(default_factory=list)  # (edge, why it cannot widen)
    best_rank: int | None = None

    @property
    def finalists(self) -> list:
        """The best rank's finals (with budgets and sizes: its trunks at the first size, the largest budget;
        the rest is the section on budgets and sizes)."""
        return [
            t
            for t in self.final
            if int(t.attrs.get("rank", 0)) == self.best_rank and t.attrs.get("headline", True)
        ]

    @property
    def at_optimum(self) -> bool:
        """No edge left, and none held at a bound the train config refuses to pass."""
        return not self.edges and not self.limits

    def where(self) -> str:
        """The verdict table's cell: yes, or on which side of which key the best config is not bracketed."""
        if self.at_optimum:
            return "yes"
        side = {"lower": "below", "upper": "above"}
        parts = [
            f"not at the optimum: {e.key} {e.best:.4g}, nothing worse {side[e.bound]} (its {e.bound} bound "
            f"{e.value:.4g})"
            for e in self.edges
        ]
        parts += [
            f"at a bound the train config will not pass: {e.key} {e.bound} {e.value:.4g}"
            for e, _ in self.limits
        ]
        return "; ".join(parts)


def collect(driver) -> list[ArmReport]:
    from mars.study.extend import widen

    out = []
    for arm in driver.study.arms:
        state = driver.arm_state(arm)
        edges = driver.edges(arm, state) if state.rounds else []
        limits: list = []
        if edges:  # which of them the train config would not let widen
            _, limits = widen(state.rounds[-1], edges, 1, lambda k, v, a=arm: driver.refuses(a, k, v))
        at_limit = {(e.key, e.bound) for e, _ in limits}
        rep = ArmReport(
            arm.name,
            driver.configs[arm.name].optimizer if arm.name in driver.configs else "?",
            state.rounds,
            state.search,
            state.final,
            state.plan,
            [e for e in edges if (e.key, e.bound) not in at_limit],
            limits,
        )
        rep.best_rank = best_finalist(state.final, driver.metric.higher_is_better)
        out.append(rep)
    return out


def _baseline_args(rep: ArmReport) -> list[str]:
    t = rep.finalists[0]
    return [f"optimizer.name={rep.optimizer}", *(f"{k}={_text(v)}" for k, v in sorted(t.params.items()))]


def _text(v) -> str:
    return repr(v) if isinstance(v, float) else hydra_value(v)


def verdict_command(driver, arms: list[ArmReport]) -> tuple[list[Path], list[str], str]:
    """The run dirs, the --baseline pairs and the report.py command line of the verdict."""
    s = driver.study
    dirs = [t.dir for rep in arms if rep.best_rank is not None for t in rep.finalists]
    base = next(r for r in arms if r.name == s.baseline)
    pairs = _baseline_args(base) if base.best_rank is not None else []
    out = s.dir / REPORT_DIR
    args = [*map(str, dirs), *(a for p in pairs for a in ("--baseline", p)), "--metric", driver.metric.key]
    if s.spec["metric"]["direction"]:
        args += ["--direction", s.spec["metric"]["direction"]]
    args += ["--out", str(out)]
    return dirs, pairs, "python scripts/report.py " + " ".join(shlex.quote(a) for a in args)


def write_study_report(driver) -> list[Path]:
    from mars.analysis.report import build_report, comparison_table, markdown_table, verdict, write_report

    s, m = driver.study, driver.metric
    out = s.dir / REPORT_DIR
    out.mkdir(parents=True, exist_ok=True)
    arms = collect(driver)
    written: list[Path] = []
    dirs, pairs, command = verdict_command(driver, arms)
    for d in dirs:  # the verdict is read from the finals' run dirs, not the storage
        metrics = Path(d) / "metrics.jsonl"
        if not metrics.is_file() or metrics.stat().st_size == 0:
            raise StudyError(
                f"{metrics} is {'empty' if metrics.is_file() else 'missing'}, though the storage records its "
                "trial as finished: the verdict is read from the finals' run dirs; restore it (from a backup "
                "or the run's W&B history), then rerun with --report"
            )
    report = None
    base = next(r for r in arms if r.name == s.baseline)
    if base.best_rank is not None and dirs:
        report = build_report(
            dirs, pairs, metric=m.key, direction=s.spec["metric"]["direction"], best=False, paired=True
        )
        written += write_report(report, out)
    for rep in arms:
        spaces = [r.space for r in rep.rounds]
        if rep.rounds and rep.search:
            written += search_figure(
                out / f"search_{rep.name}.png", rep.name, rep.rounds[-1].space, spaces, rep.search, m
            )
    written += sensitivity_figure(
        out / "sensitivity.png", {r.name: (r.rounds[-1].space, r.search) for r in arms if r.rounds}, m
    )
    lines = _markdown(driver, arms, report, command, markdown_table, comparison_table, verdict)
    ladder = None
    if driver.sizes:  # budgets and sizes: their table, fits and figures (mars.study.ladder_report)
        from mars.study.ladder_report import ladder_section

        more, ladder_figs, ladder = ladder_section(driver, arms, out, _table)
        lines += more
        written += ladder_figs
    figs = [p for p in written if p.suffix == ".png" and p.name != "report_curves.png"]
    lines += [""] + [f"![{p.stem}]({p.name})" for p in figs]
    from mars.study.averaged import averaged_section  # train.average: the same runs judged on both

    more, averaged_files, averaged = averaged_section(driver, arms, out, _table, dirs, pairs, report)
    lines += more
    written += averaged_files
    md = write_atomic(out / "study.md", "\n".join(lines) + "\n")
    study_json = {**_json(driver, arms, report, command), "ladder": ladder, "averaged": averaged or None}
    js = write_atomic(out / "study.json", json.dumps(jsonable(study_json), indent=2) + "\n")
    return [md, js, *written]


def _verdict_rows(driver, arms, report, verdict_fn) -> list[list[str]]:
    rows = []
    by_dir = {}
    if report is not None:
        for g in report.groups:
            for r in g.runs:
                by_dir[str(Path(r.path).resolve())] = g
    for rep in arms:
        if rep.best_rank is None:
            rows.append([rep.name, "-", "-", "no finalist (every search trial diverged)", "-", "-", "-", "-"])
            continue
        t = rep.finalists[0]
        config = _config(t.params) or "(nothing searched)"
        vals = [x.value for x in rep.finalists if x.value is not None]
        mean, std = mean_std(vals)
        g = by_dir.get(str(Path(t.dir).resolve())) if t.dir else None
        diff = p = ver = "-"
        if g is not None and g.baseline:
            diff, ver = "baseline", "-"
        elif g is not None and g.comparison is None:
            diff = f"n/a ({g.comparison_note})"
        elif g is not None:
            c = g.comparison
            diff = f"{c.difference:+.4f} ({c.ci[0]:+.4f} to {c.ci[1]:+.4f})"
            p = f"{c.p:.3g} / {c.p_holm:.3g}" if c.p_holm is not None else f"{c.p:.3g}"
            ver = verdict_fn(report, g)
        where = rep.where()
        rows.append(
            [
                f"**{rep.name}**" if rep.name == driver.study.baseline else rep.name,
                config,
                f"{_pm(mean, std)} (n={len(vals)})",
                diff,
                p,
                ver,
                where,
            ]
        )
    return rows


def _markdown(driver, arms, report, command, markdown_table, comparison_table, verdict_fn) -> list[str]:
    s, m = driver.study, driver.metric
    seeds = s.seeds
    L = [f"# Study {s.name}", ""]
    L.append(f"- spec: `{s.dir / 'spec.yaml'}`; storage `{shown(s.storage)}`")
    L.append(f"- base overrides: `{' '.join(s.base) or '(none)'}`")
    sp = s.spec["sampler"]
    L.append(
        f"- search: {sp['name']} sampler, seed {sp['seed']}; train.seed={s.spec['search_seed']}; metric: "
        f"{s.spec['metric']['summary']} {m.key} ({m.direction} is better)"
    )
    L.append(f"- finals: top {s.spec['final']['top_k']} per arm, seeds {seeds} (shared by all arms: paired)")
    L.append(f"- the verdict is `report.py` on the best finalists' run dirs: `{command}`")
    L += ["", "## Verdict", ""]
    L.append(
        f"Each arm's best config (its finals: mean ± std of the {s.spec['metric']['summary']} {m.title} over "
        f"seeds), against **{s.baseline}**'s (bold): the paired difference with its 95% interval, p "
        "uncorrected / Holm-corrected, the verdict at p (Holm) < 0.05, and whether the config is at the "
        "optimum of its range (no edge left, mars.analysis.edges)."
    )
    L += ["", _table(
        ["arm", "best config", f"final {m.title}", "difference (95% CI)", "p / p Holm", "verdict"]
        + ["at the optimum"],
        _verdict_rows(driver, arms, report, verdict_fn),
    )]  # fmt: skip
    if report is not None:
        L += ["", "report.py's tables of the same runs (`report.md`):", "", markdown_table(report)]
        if len(report.groups) > 1:
            L += ["", comparison_table(report)]
    else:
        L += ["", f"No verdict: the baseline arm {s.baseline} has no finished finalist."]
    L += ["", "## Edges", ""]
    any_edge = False
    for rep in arms:
        for r in rep.rounds[1:]:
            any_edge = True
            L += [f"- {note} (round {r.number}: {r.trials} trials)" for note in r.notes]
        for e in rep.edges:
            any_edge = True
            L.append(f"- {e.line()}: **not at the optimum** (auto_extend spent)")
        for e, why in rep.limits:
            any_edge = True
            L.append(
                f"- {rep.name}: the best {e.key}, {e.best:.4g}, is not bracketed towards its {e.bound} bound "
                f"{e.value:.4g}, and the train config refuses to widen the range there ({why}): an optimum "
                "constrained by the config (e.g. gamma cannot go below 0), or one beyond a setting to change "
                "(e.g. schedule.min_lr)"
            )
    if not any_edge:
        L.append("- every arm's best is bracketed: a worse trial on each side of it, along every key")
    L += ["", "## Budget", ""]
    L.append(_budget_table(arms))
    L += ["", "## Best search trials", ""]
    for rep in arms:
        top = ranked(rep.search, m.higher_is_better)[:5]
        L.append(f"{rep.name}: " + "; ".join(f"{t.value:.4f} ({_config(t.params)}; {t.dir})" for t in top))
        L.append("")
    L += ["## Sensitivity", ""]
    tolerance = s.spec["edges"]["tolerance"]
    L.append(
        "Each searched key around the best trial: on each side, the nearest trial worse than it by more "
        f"than the tolerance ({tolerance:g}, study.edges.tolerance) and by how much; a side with none is an "
        "edge, and the verdict's 'at the optimum' says so. The profile (sensitivity.png) is the best trial "
        "in each of a few equal bins of the key's range (log where searched log), the other keys free."
    )
    L += ["", _sensitivity_table(arms, m, tolerance)]
    L += ["", "## Diverged and failed trials", ""]
    bad = [t for rep in arms for t in rep.search + rep.final if t.status not in ("completed", "running")]
    if not bad:
        L.append("- none")
    for t in bad:
        why = str(t.attrs.get("message") or t.attrs.get("status") or t.state).split(". ")[0]
        L.append(f"- {t.arm} {t.phase} {t.dir}: {t.status}: {why}")
    return L


def _budget_table(arms) -> str:
    rows = []
    for rep in arms:
        done = [t for t in rep.search + rep.final if t.state == "COMPLETE"]
        rounds = " + ".join(
            str(len([t for t in rep.search if t.round == r.number and t.state != "FAIL"])) for r in rep.rounds
        )
        tokens = sum(float(t.attrs.get("tokens", 0) or 0) for t in done)
        wall = sum(float(t.attrs.get("process_s", 0) or 0) for t in done)
        over = [float(t.attrs.get("overhead_s", 0) or 0) for t in done]
        diverged = sum(t.status == "diverged" for t in rep.search)
        rows.append(
            [
                rep.name,
                rounds if len(rep.rounds) < 2 else f"{rounds} = {sum(t.state != 'FAIL' for t in rep.search)}",
                str(diverged),
                str(len(rep.final)),
                f"{tokens / 1e6:.2f}M",
                f"{wall / 60:.1f} min",
                f"{sum(over) / len(over):.2f} s" if over else "-",
            ]
        )
    return _table(
        ["arm", "search trials (per round)", "diverged", "final runs", "tokens", "trial time (sum)"]
        + ["driver overhead per trial"],
        rows,
    )  # fmt: skip


def _sensitivity_table(arms, m, tolerance: float) -> str:
    """Per arm and key: the best trial's value, and on each side of it the nearest trial worse by more
    than the tolerance (the same mars.analysis.edges.sides the verdict's edges come from: a side with
    none is an edge), and the bins of the profile within 1% of the best."""
    from mars.analysis.edges import sides
    from mars.study.extend import points_of

    rows = []
    for rep in arms:
        if not rep.rounds:
            continue
        points = points_of(rep.search)
        for key, d in rep.rounds[-1].space.items():
            found = sides(points, key, m.higher_is_better, tolerance) if d.numeric else None
            if found is None:
                continue
            best = min(
                (t for t in rep.search if t.finite), key=lambda t: -t.value if m.higher_is_better else t.value
            )
            prof = profile(rep.search, key, d, m.higher_is_better, bins_for(len(rep.search)))
            vals = [v for _, v, _ in prof if math.isfinite(v)]
            near = [
                c
                for c, v, _ in prof
                if vals and math.isfinite(v) and abs(v - best.value) <= 0.01 * abs(best.value)
            ]
            rows.append(
                [
                    rep.name,
                    key,
                    f"{_short(d.lo)} - {_short(d.hi)}" + (" (log)" if d.log else ""),
                    f"{_short(best.params[key])} ({best.value:.4f})",
                    *(_side_cell(side) for side in found),
                    f"{_short(min(near))} - {_short(max(near))}" if near else "-",
                ]
            )
    return _table(
        ["arm", "key", "range", "best trial (its value)", "nearest worse trial below (by)"]
        + ["nearest worse trial above (by)", "bins within 1% of the best"],
        rows,
    )  # fmt: skip


def _side_cell(side) -> str:
    if side.bracketed:
        by = "diverged" if not math.isfinite(side.worse_by) else f"+{side.worse_by:.3f}"
        return f"{_short(side.nearest)} ({by})"
    return f"none of {side.beyond}: an edge" if side.beyond else "none: an edge"


def _json(driver, arms, report, command) -> dict:
    from mars.analysis.report import to_json
    from mars.study.records import dist_to_dict

    def trial(t):
        return {"index": t.index, "round": t.round, "number": t.number, "params": t.params, "value": t.value,
                "status": t.status, "dir": str(t.dir) if t.dir else None,
                **{k: t.attrs.get(k) for k in ("rank", "seed", "message", "tokens", "train_s", "process_s",
                                                "overhead_s", "attempts")}}  # fmt: skip

    return {
        "name": driver.study.name,
        "spec": public_spec(driver.study.spec),
        "metric": {"key": driver.metric.key, "higher_is_better": driver.metric.higher_is_better},
        "baseline": driver.study.baseline,
        "verdict_command": command,
        "verdict": to_json(report) if report is not None else None,
        "arms": {
            rep.name: {
                "optimizer": rep.optimizer,
                "rounds": [
                    {
                        "round": r.number,
                        "trials": r.trials,
                        "space": [dist_to_dict(d) for d in r.space.values()],
                        "sample": [dist_to_dict(d) for d in r.sample.values()],
                        "notes": list(r.notes),
                    }
                    for r in rep.rounds
                ],  # fmt: skip
                "edges": [e.line() for e in rep.edges],
                "limits": [f"{e.key} {e.bound}: {why}" for e, why in rep.limits],
                "at_optimum": rep.at_optimum,
                "search": [trial(t) for t in rep.search],
                "finals": [trial(t) for t in rep.final],
                "best_rank": rep.best_rank,
            }
            for rep in arms
        },
    }


def _table(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _pm(mean: float, std) -> str:
    if not math.isfinite(mean):
        return str(mean)
    return f"{mean:.4f} ± " + ("-" if std is None else f"{std:.4f}")


def _config(params: dict) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in sorted(params.items()))


def _short(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else format_value(v)
