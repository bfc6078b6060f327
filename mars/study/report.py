"""The study's report: report.py's verdict on the finals, what only the study knows, and its figures.

Written into STUDY_DIR/report/:

    report.md, report.json, report_curves.png   exactly what `python scripts/report.py` writes for the
                                                same run dirs: each arm's best finalist (its seeds), the
                                                baseline arm's as the baseline (the command is printed in
                                                study.md); paired t-tests, Holm, intervals, power
    study.md, study.json                        the study: the verdict per arm, marked "not at the
                                                optimum" where an edge remains; the edges and the rounds
                                                they added; the budget each arm spent (trials, tokens,
                                                wall time, the driver's overhead); the best configs;
                                                the sensitivity table; every diverged or failed trial;
                                                with study.tune, each size's optimum and the fitted
                                                rules h*(N) checked at a held-out size (tuning_section)
    search_ARM.png, sensitivity.png             the figures (mars.study.report)
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mars.analysis.labels import format_value
from mars.analysis.plots import colors, legend_outside, pyplot, save
from mars.analysis.stats import mean_std
from mars.entry import hydra_value
from mars.errors import UserError
from mars.files import write_atomic
from mars.metrics_jsonl import jsonable
from mars.study.search import Dist, best_finalist, ranked
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
    searches: dict = field(default_factory=dict)  # scope name -> (rounds, trials): study.tune's sizes

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
    from mars.study.search import widen

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
        rep.searches = state.searches
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
            raise UserError(
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
    if driver.sizes:  # budgets and sizes: their table, fits and figures (mars.study.scale)
        from mars.study.scale import ladder_section

        more, ladder_figs, ladder = ladder_section(driver, arms, out, _table)
        lines += more
        written += ladder_figs
    more, tuning = tuning_section(driver, arms)
    lines += more
    figs = [p for p in written if p.suffix == ".png" and p.name != "report_curves.png"]
    lines += [""] + [f"![{p.stem}]({p.name})" for p in figs]
    from mars.study.averaged import averaged_section  # train.average: the same runs judged on both

    more, averaged_files, averaged = averaged_section(driver, arms, out, _table, dirs, pairs, report)
    lines += more
    written += averaged_files
    md = write_atomic(out / "study.md", "\n".join(lines) + "\n")
    study_json = {**_json(driver, arms, report, command), "ladder": ladder, "averaged": averaged or None,
                  "tuning": tuning}  # fmt: skip
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
    from mars.study.search import points_of

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
    from mars.study.search import dist_to_dict

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


# ----------------------------------------------------------------------------- tuning across sizes


@dataclass
class Optimum:
    """The best trial of an arm's search in one scope (a size, or a size and budget: study.tune)."""

    scope: object  # mars.study.scale.Scope
    x: tuple[float, ...]  # (N,) or (N, D): non-embedding parameters, tokens of the budget
    best: object  # the TrialRecord, None when every trial diverged
    edges: list
    trials: list  # every search trial of the scope

    def sampled(self, key: str) -> list[float]:
        """Every value of `key` the search tried (diverged trials too: they were looked at)."""
        return [float(t.params[key]) for t in self.trials if key in t.params]


def tuning_section(driver, arms: list[ArmReport]) -> tuple[list[str], dict | None]:
    """study.md's "Tuning across sizes" and study.json's "tuning" (study.tune): each arm's optimum per
    size (and budget); each searched numeric key's optimum fitted as a power law over the sizes,
    h*(N) or h*(N, D) (mars.analysis.hyper_scaling), and whether it moves with scale; the rule fitted
    without the held-out size (mars.study.scale.holdout_of), its prediction there, checked against the
    optimum searched there."""
    from mars.analysis.hyper_scaling import check, resolution
    from mars.study.driver import ArmState
    from mars.study.scale import holdout_of, tuned

    spec = driver.study.spec
    if not tuned(spec):
        return [], None
    tune, hold, with_d = spec["tune"], holdout_of(spec), bool(spec["tune"].get("budgets"))
    own = tune.get("finals", "own") == "own"
    law = "h*(N, D) = c N^a D^b" if with_d else "h*(N) = c N^b"
    x_is = "N: non-embedding parameters" + ("; D: tokens of a budget" if with_d else "")
    searched = ", ".join(f"{z}: {n}" for z, n in tune["trials"].items())
    finals = "its own optimum" if own else "the first size's optimum (a transfer)"
    L = ["", "## Tuning across sizes", ""]
    L.append(
        f"Each arm searched at every size of study.tune.trials ({searched} trials per arm"
        f"{', at every budget' if with_d else ''}); the finals at each size take {finals}. A size's "
        f"optimum is its search's best trial (every round). Each numeric key's optimum is fitted as {law} "
        f"({x_is}) by least squares on the log scale over the sizes (mars.analysis.hyper_scaling). Its "
        "scatter: the residuals' standard deviation s (log scale), with a floor from the searches' "
        "resolution (the RMS over the points of where each optimum lies between its best trial's "
        "neighbours). 95% intervals: Student's t with df = points - parameters on s, or the normal "
        "quantile on the floor where it is larger (or no degree of freedom is left). A key moves with "
        "scale when its exponent's interval excludes 0. An optimum at an edge of its range (nothing worse "
        "beyond it) is a bound, and a fit through it is biased."
    )
    opt_rows, rule_rows, check_rows = [], [], []
    js: dict = {"x": x_is, "holdout": hold, "optima": [], "rules": [], "holdout_check": []}
    for rep in arms:
        arm = driver.study.arm(rep.name)
        scopes = [z for z in driver.scopes(arm) if z.name]
        if not scopes or not rep.rounds:
            continue
        optima = []
        for z in scopes:
            size = driver.size_of[z.size]
            x = (float(size.params), *((float(z.steps * size.tokens_per_step),) if with_d else ()))
            best = ranked(rep.searches[z.name][1], driver.metric.higher_is_better)[:1]
            edges = driver.edges(arm, ArmState(rep.searches, [], None), z)
            optima.append(Optimum(z, x, best[0] if best else None, edges, rep.searches[z.name][1]))
        for o in optima:
            b = o.best
            where = "; ".join(f"{e.key} at its {e.bound} bound" for e in o.edges) or "-"
            found = _config(b.params) if b else "every trial diverged"
            opt_rows.append(
                [rep.name, o.scope.name, f"{o.x[0]:,.0f}", f"{b.value:.4f}" if b else "-", found, where]
            )
            js["optima"].append(
                {"arm": rep.name, "scope": o.scope.name, "size": o.scope.size, "steps": o.scope.steps,
                 "x": list(o.x), "value": b.value if b else None, "params": b.params if b else None,
                 "edges": [e.line() for e in o.edges],
                 "resolution": {k: resolution(v, o.sampled(k)) for k, v in (b.params if b else {}).items()}}
            )  # fmt: skip
        for key, d in rep.rounds[-1].space.items():
            if not d.numeric:
                continue
            pts = [
                (o.scope, o.x, o.best.params[key], resolution(o.best.params[key], o.sampled(key)))
                for o in optima
                if o.best is not None
            ]
            rule, used, note = _rule(pts, with_d)
            rule_rows.append([rep.name, key, *_rule_cells(rule, note), str(len(used))])
            js["rules"].append({"arm": rep.name, "key": key, "fit": _rule_json(rule), "note": note or None})
            if hold is None:
                continue
            fitted, _, note = _rule([p for p in pts if p[0].size != hold], with_d)
            held = [p for p in pts if p[0].size == hold]
            if not isinstance(fitted, str) and len(fitted.names) == 1:
                held = held[-1:]  # h*(N) alone: the largest budget's optimum
            for z, x, value, _ in held:
                if isinstance(fitted, str):
                    check_rows.append([rep.name, key, z.name, f"no fit: {fitted}", _short(value), "-"])
                    continue
                c = check(fitted, x[: len(fitted.names)], value)
                iv = (
                    c.interval
                    if isinstance(c.interval, str)
                    else f"{c.interval[0]:.4g} to {c.interval[1]:.4g}"
                )
                check_rows.append(
                    [rep.name, key, z.name, f"{c.predicted:.4g} ({iv})", _short(value), c.verdict()]
                )
                js["holdout_check"].append(
                    {"arm": rep.name, "key": key, "scope": z.name, "predicted": c.predicted,
                     "interval": c.interval, "searched": value, "inside": c.inside, "fit": _rule_json(fitted),
                     "note": note or None}
                )  # fmt: skip
    L += ["", "### Optimum per size", ""]
    L.append(_table(["arm", "scope", "N", f"best {driver.metric.title}", "optimum", "at an edge"], opt_rows))
    L += ["", "### Fitted rules", "", f"Over every searched size{' and budget' if with_d else ''}:", ""]
    L.append(
        _table(
            ["arm", "key", "rule", "exponent (95% CI)", "moves with scale", "scatter s / floor", "points"],
            rule_rows,
        )
    )
    L += ["", "### Prediction at the held-out size", ""]
    if hold is None:
        L.append("- none: study.tune.holdout is unset and fewer than 3 sizes are searched")
        return L, js
    L.append(
        f"Each key's rule fitted without {hold}, its prediction at {hold} with the 95% interval of a new "
        "searched optimum there (the fit's uncertainty and one search's scatter), against the optimum "
        f"{hold}'s own search found: inside or outside the interval."
    )
    L += ["", _table(["arm", "key", "scope", "predicted (95% interval)", "searched", "check"], check_rows)]
    return L, js


def _rule(pts: list, with_d: bool) -> tuple:
    """(the rule or why none, the points it used, a note): h*(N, D) when it leaves a degree of freedom,
    else h*(N) over each size's largest budget (`pts`: (scope, x, optimum, its resolution)); the points'
    resolution is the floor of their scatter (mars.analysis.hyper_scaling)."""
    from mars.analysis.hyper_scaling import fit_rule, floor_of

    note = ""
    if with_d:
        rule = fit_rule([(p[1], p[2]) for p in pts], ("N", "D"), floor_of([p[3] for p in pts]))
        if not isinstance(rule, str) and rule.df >= 1:
            return rule, pts, note
        why = rule if isinstance(rule, str) else f"{rule.points} points leave no degree of freedom"
        note = f"only h*(N) is fitted, at each size's largest budget (h*(N, D): {why})"
        last: dict = {}
        for p in pts:  # the scopes come smallest budget first
            last[p[0].size] = p
        pts = list(last.values())
    return fit_rule([((p[1][0],), p[2]) for p in pts], floor=floor_of([p[3] for p in pts])), pts, note


def _rule_cells(rule, note: str) -> list[str]:
    if isinstance(rule, str):
        return [f"no fit: {rule}", "-", "-", "-"]
    ivs = {n: rule.exponent_interval(n) for n in rule.names}
    exps = "; ".join(
        f"{n}: {rule.exponent(n):.3g} "
        + (f"({iv[0]:.3g} to {iv[1]:.3g})" if not isinstance(iv, str) else f"({iv})")
        for n, iv in ivs.items()
    )
    moves = [n for n in rule.names if rule.moves(n)]
    unknown = any(rule.moves(n) is None for n in rule.names)
    verdict = f"yes: with {' and '.join(moves)}" if moves else ("unknown (no interval)" if unknown else "no")
    s = f"{rule.s:.3g}" if rule.df >= 1 else "-"
    return [rule.formula() + (f" ({note})" if note else ""), exps, verdict, f"{s} / {rule.floor:.3g}"]


def _rule_json(rule) -> dict:
    if isinstance(rule, str):
        return {"reason": rule}
    return {
        "formula": rule.formula(),
        "c": rule.c,
        "exponents": {n: rule.exponent(n) for n in rule.names},
        "intervals": {n: rule.exponent_interval(n) for n in rule.names},
        "moves": {n: rule.moves(n) for n in rule.names},
        "points": rule.points,
        "df": rule.df,
        "s": rule.s if rule.df >= 1 else None,
        "floor": rule.floor,
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


# --------------------------------------------------------------------------------------------------
# The study's figures: each arm's metric against each searched key, and the sensitivity profiles.
#
# * search_ARM.png: one panel per searched key, every search trial as a point (one marker per round),
#   log axes where the key's range is log, the best trial marked, diverged trials as crosses on the top
#   edge (bottom for metrics where higher is better), each round's range as dashed lines.
# * sensitivity.png: one panel per key, one line per arm that searched it: the profile, i.e. the best
#   trial in each of a few equal bins of the key's range (in the coordinate it was searched in). With
#   the other keys free, the profile is what the arm reaches with that key fixed near a value, which is
#   the curve Wen et al. (2025) draw for each hyperparameter around an optimizer's optimum, here read off
#   the search instead of 1-D sweeps. How far it rises from its best across the range is the
#   sensitivity (the report's table).


MARKERS = "osD^v<>ph"


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def search_figure(
    out: Path, arm: str, space: dict[str, Dist], rounds: Sequence[dict[str, Dist]], trials, metric
) -> list[Path]:
    """`trials`: TrialRecords of the arm's search; `rounds`: each round's full space."""
    plt = pyplot()
    keys = list(space)
    fig, axes = plt.subplots(
        1, max(1, len(keys)), figsize=(4.2 * max(1, len(keys)), 3.4), layout="constrained"
    )
    axes = np.atleast_1d(axes)
    done = [t for t in trials if t.state == "COMPLETE"]
    finite = _finite([t.value for t in done])
    lo_y, hi_y = (min(finite), max(finite)) if finite else (0.0, 1.0)
    edge_y = hi_y if not metric.higher_is_better else lo_y
    best = None
    if finite:
        pick = min if not metric.higher_is_better else max
        best = pick(
            (t for t in done if t.value is not None and math.isfinite(t.value)), key=lambda t: t.value
        )
    for ax, key in zip(axes, keys, strict=False):
        d = space[key]
        for r in sorted({t.round for t in done}):
            pts = [t for t in done if t.round == r]
            xs = [_x(t.params.get(key), d) for t in pts if t.value is not None and math.isfinite(t.value)]
            ys = [t.value for t in pts if t.value is not None and math.isfinite(t.value)]
            ax.scatter(xs, ys, s=22, marker=MARKERS[r % len(MARKERS)], label=f"round {r}" if r else "search")
            bad = [_x(t.params.get(key), d) for t in pts if t.value is None or not math.isfinite(t.value)]
            if bad:
                ax.scatter(bad, [edge_y] * len(bad), marker="x", color="red", s=30, label="diverged")
        if best is not None:
            ax.scatter(
                [_x(best.params.get(key), d)],
                [best.value],
                marker="*",
                s=180,
                color="black",
                zorder=5,
                label="best",
            )
        if d.numeric:
            for r, rs in enumerate(rounds):
                if key in rs:
                    for b in (rs[key].lo, rs[key].hi):
                        ax.axvline(b, color="grey", lw=0.8, ls="--" if r else ":", alpha=0.7)
            if d.log:
                ax.set_xscale("log")
        ax.set_xlabel(key + (" (log)" if d.log else ""))
        ax.set_ylabel(metric.axis_label)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{arm}: {metric.key} of each search trial")
    legend_outside(fig, list(axes))
    return save(fig, out)


def _x(value, d: Dist):
    return value if d.numeric else str(value)


def profile(trials, key: str, d: Dist, higher_is_better: bool, bins: int) -> list[tuple[float, float, int]]:
    """(bin centre, best finite value in the bin, trials in the bin) over d's range, bins with trials only."""
    if not d.numeric:
        return []
    rng = d.range()
    edges = np.linspace(0.0, 1.0, bins + 1)
    out = []
    for i in range(bins):
        inside = []
        for t in trials:
            x = t.params.get(key)
            if t.state != "COMPLETE" or not isinstance(x, (int, float)):
                continue
            p = rng.position(float(x))
            if edges[i] <= p < edges[i + 1] or (i == bins - 1 and p == 1.0):
                inside.append(t)
        vals = _finite([t.value for t in inside])
        if not inside:
            continue
        best = (max if higher_is_better else min)(vals) if vals else math.nan
        c = (edges[i] + edges[i + 1]) / 2
        a, b = rng.coordinate(rng.lo), rng.coordinate(rng.hi)
        centre = math.exp(a + c * (b - a)) if rng.log else a + c * (b - a)
        out.append((centre, best, len(inside)))
    return out


def bins_for(n: int) -> int:
    return max(2, min(6, n // 3))


def sensitivity_figure(out: Path, arms: dict, metric) -> list[Path]:
    """`arms`: name -> (its final space, its search trials)."""
    plt = pyplot()
    keys = sorted({k for space, _ in arms.values() for k, d in space.items() if d.numeric})
    if not keys:
        return []
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4), layout="constrained")
    axes = np.atleast_1d(axes)
    palette = dict(zip(arms, colors(len(arms)), strict=True))
    for ax, key in zip(axes, keys, strict=True):
        log = False
        for arm, (space, trials) in arms.items():
            if key not in space:
                continue
            d = space[key]
            log = log or d.log
            prof = profile(trials, key, d, metric.higher_is_better, bins_for(len(trials)))
            xs = [c for c, v, _ in prof if math.isfinite(v)]
            ys = [v for _, v, _ in prof if math.isfinite(v)]
            ax.plot(xs, ys, marker="o", color=palette[arm], label=arm)
        if log:
            ax.set_xscale("log")
        ax.set_xlabel(key + (" (log)" if log else ""))
        ax.set_ylabel(f"best {metric.title} in the bin")
        ax.grid(alpha=0.3)
    fig.suptitle("Sensitivity: the best trial in each bin of the key's range")
    legend_outside(fig, list(axes))
    return save(fig, out)
