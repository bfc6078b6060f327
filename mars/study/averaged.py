"""The study report's section on averaged weights (study.md "Averaged weights", study.json "averaged", and
report/averaged/): when the finals kept an average of their weights (train.average) and logged its value
of the study's metric next to the model's (val/loss_avg next to val/loss, downstream_avg/... next to
downstream/...), the same runs are judged twice. Averaging never changes training, so each run gives both
numbers, and the section says

* per arm, the averaged weights' final value against the model's: the paired difference over seeds (the
  same run: averaged minus model) with its 95% interval and p, Holm over every arm (and budget and size);
* the verdict against the baseline arm on each: does averaging change it, or the ranking?
* with budgets and sizes, the same per size and budget, and the budget table, fits, speedups and
  performance profile of the averaged value (mars.study.scale), with its figures in
  report/averaged/, where report.py's report of the averaged value also goes.
"""

from __future__ import annotations

import math
from pathlib import Path

AVERAGED_DIR = "averaged"


def averaged_key(key: str) -> str | None:
    """The key the averaged weights log for `key` (mars.train.metrics), None when there is none."""
    if key == "val/loss":
        return "val/loss_avg"
    if key.startswith("downstream/"):
        return "downstream_avg/" + key.removeprefix("downstream/")
    return None


def averaged_section(
    driver, arms, out: Path, table, dirs, pairs, report
) -> tuple[list[str], list[Path], dict]:
    """study.md's lines, the files written and study.json's "averaged" ({} and nothing written when the
    finals logged no averaged value of the metric). `dirs`, `pairs`: the verdict's run dirs and --baseline
    pairs; `report`: the verdict's report of the metric itself."""
    from mars.analysis.report import build_report, verdict, write_report
    from mars.analysis.runs import load_run

    m = driver.metric
    key = averaged_key(m.key)
    if key is None or report is None or not dirs:
        return [], [], {}
    if not all(key in load_run(Path(d)).metrics for d in dirs):
        return [], [], {}
    s = driver.study
    sub = out / AVERAGED_DIR
    averaged = build_report(dirs, pairs, metric=key, direction=s.spec["metric"]["direction"], paired=True)
    written = write_report(averaged, sub)
    L = ["", "## Averaged weights", ""]
    L.append(
        f"The finals kept an average of their weights ({_setting(dirs[0])}) and logged its {key} next to "
        f"{m.key}: the same runs, judged on each (averaging does not change training). Per arm: the "
        "averaged weights' final value against the model's (paired over seeds: averaged minus model, 95% "
        f"interval, p / Holm over the arms), and the verdict against **{s.baseline}** on each; report.py's "
        f"report of {key} is in `{AVERAGED_DIR}/report.md`."
    )
    rows, js = _effects(driver, arms, report, averaged, verdict)
    L += ["", table(["arm", f"final {m.title}", "averaged", "averaged - model (95% CI)", "p / p Holm",
                     f"vs {s.baseline}: model", f"vs {s.baseline}: averaged"], rows)]  # fmt: skip
    out_js: dict = {"key": key, "arms": js}
    if driver.sizes:
        more, cell_js = _cells(driver, arms, m.key, key, table)
        L += more
        out_js["cells"] = cell_js
        from mars.study.scale import ladder_section

        sub.mkdir(parents=True, exist_ok=True)
        ladder_lines, figs, ladder_js = ladder_section(driver, arms, sub, table, key=key)
        L += [_demoted(line) for line in ladder_lines]
        L += [""] + [f"![{p.stem}]({AVERAGED_DIR}/{p.name})" for p in figs if p.suffix == ".png"]
        written += figs
        out_js["ladder"] = ladder_js
    return L, written, out_js


def _demoted(line: str) -> str:
    """The ladder section's headings one level down, under "Averaged weights"."""
    if line.startswith("## "):
        return "### Budgets and sizes of the averaged weights"
    return "#" + line if line.startswith("### ") else line


def _setting(run_dir) -> str:
    from mars.analysis.runs import load_run

    flat = load_run(Path(run_dir), with_metrics=False).flat
    kind = flat.get("train.average", "?")
    if kind == "ema":
        decay = flat.get("train.average_decay")
        return "train.average=ema" + (f", decay {decay}" if decay is not None else "")
    start = flat.get("train.average_start")
    return f"train.average={kind}" + (
        f", start {start}" if start is not None else ", from the lr decay's start"
    )


def _effects(driver, arms, report, averaged, verdict_fn) -> tuple[list[list[str]], list[dict]]:
    """Per arm: the averaged weights against the model on the same runs, and the two verdicts."""
    from mars.analysis.significance import compare, holm

    by_label = {g.label: g for g in averaged.groups}
    found = []
    for g in report.groups:
        a = by_label.get(g.label)
        if a is None:
            continue
        model = {r.path: r.final for r in g.runs}
        pairs = [(r.final, model[r.path]) for r in a.runs if r.path in model]
        c = (
            compare([p[0] for p in pairs], [p[1] for p in pairs], paired=True)
            if len(pairs) > 1
            else "one seed"
        )
        found.append((g, a, c, _mean([x - y for x, y in pairs])))
    tested = [c for _, _, c, _ in found if not isinstance(c, str)]
    corrected = dict(zip(map(id, tested), holm([c.p for c in tested]), strict=True))
    rows, js = [], []
    for g, a, c, mean_difference in found:
        name = _arm_of(g, arms)
        if isinstance(c, str):
            diff, p = f"{mean_difference:+.4f} (no interval: {c})", "-"
        else:
            diff = f"{c.difference:+.4f} ({c.ci[0]:+.4f} to {c.ci[1]:+.4f})"
            p = f"{c.p:.3g} / {corrected[id(c)]:.3g}"
        rows.append([f"**{name}**" if g.baseline else name, f"{g.final[0]:.4f}", f"{a.final[0]:.4f}", diff, p,
                     "baseline" if g.baseline else verdict_fn(report, g),
                     "baseline" if a.baseline else verdict_fn(averaged, a)])  # fmt: skip
        tested = not isinstance(c, str)
        js.append(
            {
                "arm": name,
                "model": g.final[0],
                "averaged": a.final[0],
                "difference": mean_difference,
                "p": c.p if tested else None,
                "p_holm": corrected[id(c)] if tested else None,
                "verdict_model": verdict_fn(report, g),
                "verdict_averaged": verdict_fn(averaged, a),
            }
        )
    return rows, js


def _mean(values) -> float:
    values = [v for v in values if math.isfinite(v)]
    return sum(values) / len(values) if values else math.nan


def _arm_of(group, arms) -> str:
    paths = {str(Path(r.path).resolve()) for r in group.runs}
    for rep in arms:
        if any(t.dir and str(Path(t.dir).resolve()) in paths for t in rep.final):
            return rep.name
    return group.label


def _cells(driver, arms, key: str, averaged_key: str, table) -> tuple[list[str], list[dict]]:
    """Per size, budget and arm: the model's and the averaged weights' mean final value, averaging's paired
    effect (Holm over the table), the difference to the baseline arm on each, and whether the arms' order
    moved."""
    from mars.analysis.significance import compare, holm
    from mars.study.scale import ladder_of

    s = driver.study
    model, avg = ladder_of(driver, arms, key), ladder_of(driver, arms, averaged_key)
    entries = []
    for cell in sorted(model.cells, key=lambda c: ([z.name for z in model.sizes].index(c[1]), c[2], c[0])):
        arm, size, steps = cell
        mine, theirs = model.cells[cell], avg.cells.get(cell, {})
        seeds = sorted(set(mine) & set(theirs))
        c = (
            compare([theirs[x] for x in seeds], [mine[x] for x in seeds], paired=True)
            if len(seeds) > 1
            else "one seed"
        )
        entries.append((cell, _mean([theirs[x] - mine[x] for x in seeds]), c))
    tested = [c for _, _, c in entries if not isinstance(c, str)]
    corrected = dict(zip(map(id, tested), holm([c.p for c in tested]), strict=True))

    def mean(cells, cell):
        v = [x for x in cells.get(cell, {}).values() if math.isfinite(x)]
        return sum(v) / len(v) if v else math.nan

    def order(cells, size, steps):
        return [a for a in sorted(model.arms, key=lambda a: mean(cells, (a, size, steps)))]

    rows, js = [], []
    for (arm, size, steps), mean_difference, c in entries:
        base = (s.baseline, size, steps)
        vs = [
            "baseline" if arm == s.baseline else f"{mean(cells, (arm, size, steps)) - mean(cells, base):+.4f}"
            for cells in (model.cells, avg.cells)
        ]
        moved = order(model.cells, size, steps) != order(avg.cells, size, steps)
        diff = (
            f"{mean_difference:+.4f} (no interval: {c})"
            if isinstance(c, str)
            else f"{c.difference:+.4f} ({c.ci[0]:+.4f} to {c.ci[1]:+.4f})"
        )
        p = "-" if isinstance(c, str) else f"{c.p:.3g} / {corrected[id(c)]:.3g}"
        ours, averaged = mean(model.cells, (arm, size, steps)), mean(avg.cells, (arm, size, steps))
        rows.append([size or "-", str(steps), arm, f"{ours:.4f}", f"{averaged:.4f}", diff, p, *vs])
        rows[-1].append("yes" if moved else "no")
        tested = not isinstance(c, str)
        js.append(
            {
                "arm": arm,
                "size": size,
                "steps": steps,
                "model": ours,
                "averaged": averaged,
                "difference": mean_difference,
                "p_holm": corrected[id(c)] if tested else None,
                "order_moved": moved,
            }
        )
    L = ["", "### Averaging at every size and budget", ""]
    L.append(
        "Mean final value over seeds of the model and of its averaged weights; averaging's paired effect "
        "(averaged minus model, 95% interval; p / Holm over the table); the mean difference to "
        f"**{s.baseline}** on each; and whether the arms' order at that size and budget moved."
    )
    L += ["", table(["size", "budget (steps)", "arm", "model", "averaged", "averaged - model (95% CI)",
                     "p / p Holm", f"vs {s.baseline}: model", f"vs {s.baseline}: averaged", "order moved"],
                    rows)]  # fmt: skip
    return L, js
