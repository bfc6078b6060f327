"""The study report's section on budgets and sizes (study.md "Budgets and sizes", study.json "ladder", and
loss_vs_tokens.png, speedup_vs_tokens.png, speedup_vs_size.png, performance_profile.png): the budget
table, the fits and the speedups of mars.analysis.scaling on the finals of each arm's best finalist, the
speedups per second (times the ratio of throughputs), and the performance profile over every budget and
size (mars.analysis.profile)."""

from __future__ import annotations

import math
from pathlib import Path

from mars.analysis.scaling import Analysis, Ladder, SizeInfo, analyse, budget_table, extrapolation_label

UNRESOLVED = 100.0  # an interval wider than this factor is marked "unresolved"


def ladder_of(driver, arms, key: str | None = None) -> Ladder:
    """The best finalist's finals of every arm (`arms`: the report's ArmReports), by size and budget: the
    study's metric as recorded, or (`key`) another key's final value, read from each run dir."""
    cells: dict[tuple[str, str, int], dict[int, float]] = {}
    for rep in arms:
        if rep.best_rank is None:
            continue
        for t in rep.final:
            if int(t.attrs.get("rank", 0)) != rep.best_rank or t.state != "COMPLETE" or "role" not in t.attrs:
                continue
            value = t.value if t.value is not None else math.nan
            if key is not None:
                value = _final(t.dir, key)
            cells.setdefault((rep.name, str(t.attrs["size"]), int(t.attrs["steps"])), {})[
                int(t.attrs["seed"])
            ] = value
    sizes = [SizeInfo(z.name, z.tokens_per_step, z.params) for z in driver.sizes]
    return Ladder(cells, sizes, [a.name for a in driver.study.arms], driver.study.baseline)


def _final(run_dir, key: str) -> float:
    from mars.analysis.runs import load_run

    return load_run(Path(run_dir)).final(key) if run_dir else math.nan


def throughputs(arms) -> dict[tuple[str, str], float]:
    """(arm, size) -> tokens per training second, the mean over the best finalist's trunks (their
    metrics' train_time; mars.analysis.time_to_target.throughput); absent where none was logged."""
    from mars.analysis.runs import load_run
    from mars.analysis.time_to_target import throughput

    rates: dict[tuple[str, str], list[float]] = {}
    for rep in arms:
        for t in rep.final:
            if rep.best_rank is None or int(t.attrs.get("rank", 0)) != rep.best_rank:
                continue
            if t.attrs.get("role") != "trunk" or t.state != "COMPLETE" or not t.dir:
                continue
            rate = throughput(load_run(Path(t.dir)))
            if rate is not None:
                rates.setdefault((rep.name, str(t.attrs["size"])), []).append(rate)
    return {k: sum(v) / len(v) for k, v in rates.items()}


def profile_costs(ladder: Ladder, rates: dict[tuple[str, str], float]) -> dict[str, dict]:
    """{"tokens" | "seconds": {cell: {arm: cost}}} of the performance profile (mars.analysis.profile):
    a cell is a size and budget, its target the baseline's median final value there."""
    import numpy as np

    from mars.analysis.profile import tokens_to_reach

    costs: dict[str, dict] = {"tokens": {}, "seconds": {}}
    for z in ladder.sizes:
        curves = {
            arm: sorted(
                (d, float(np.median(list(v.values())))) for d, v in ladder.finals(arm, z).items() if v
            )
            for arm in ladder.arms
        }
        for d, target in curves.get(ladder.baseline, []):
            cell = f"{z.name or '-'} / {d:,.0f} tokens"
            for arm, curve in curves.items():
                tokens = tokens_to_reach(curve, target)
                costs["tokens"].setdefault(cell, {})[arm] = tokens
                if (arm, z.name) in rates:
                    costs["seconds"].setdefault(cell, {})[arm] = tokens / rates[(arm, z.name)]
    costs["seconds"] = {c: v for c, v in costs["seconds"].items() if len(v) == len(costs["tokens"][c])}
    return costs


def _iv(iv) -> str:
    """An interval; one spanning more than a factor 100 is marked unresolved (the fit could be anything)."""
    if isinstance(iv, str):
        return f"(no interval: {iv})"
    wide = "unresolved: " if not iv.low > 0 or iv.high / iv.low > UNRESOLVED else ""
    return f"({wide}{iv.low:.3g} to {iv.high:.3g})"


def _fit_cell(f, ivals=None) -> list[str]:
    if isinstance(f, str):
        return [f"no fit: {f}", "", ""]
    ivals = ivals or {}
    return [
        f"{f.c:.4g} {_iv(ivals['E'])}" if "E" in ivals else f"{f.c:.4g}",
        f"{f.a:.4g} {_iv(ivals['A'])}" if "A" in ivals else f"{f.a:.4g}",
        f"{f.b:.4g} {_iv(ivals['alpha'])}" if "alpha" in ivals else f"{f.b:.4g}",
    ]


def ladder_section(
    driver, arms, out: Path, table, key: str | None = None
) -> tuple[list[str], list[Path], dict]:
    """study.md's lines, the figures written, and study.json's "ladder" (of another logged `key` than the
    study's metric when given: mars.study.averaged)."""
    from mars.analysis.metric import metric_of
    from mars.analysis.scaling_plots import scaling_figures
    from mars.study.budgets import budget_lines

    s = driver.study
    title = driver.metric.title if key is None else metric_of(key).title
    ladder = ladder_of(driver, arms, key)
    an = analyse(ladder)
    rates = throughputs(arms)
    per_step = {z.name: z.tokens_per_step for z in ladder.sizes}
    rows = budget_table(ladder.cells, per_step, s.baseline, [z.name for z in ladder.sizes])
    L = ["", "## Budgets and sizes", ""]
    L.append(
        "Every budget of each arm's best config, per size and seed: one wsd trunk of the largest budget and "
        f"a cooldown branch forked at each smaller budget's decay start (mars.study.budgets). Budgets in "
        f"{s.spec['budget_unit']}: {s.spec['budgets'] or '(the base)'}."
    )
    runs = s.spec["final"]["top_k"] * len(s.seeds)
    L += [""] + [f"- {line}" for line in budget_lines(driver.sizes, len(s.arms), runs)]
    spent = _wall(arms)
    if spent:
        L.append(
            f"- wall time of the trunks {spent[0]:.0f} s and of the branches {spent[1]:.0f} s (launch to "
            "exit, summed)"
        )
    L += ["", "### Budget table", ""]
    L.append(
        f"Final {title}, mean ± std over seeds (n); the paired difference to **{s.baseline}** "
        "at the same size and budget with its 95% interval; p uncorrected / Holm over the whole table."
    )
    body = []
    for r in rows:
        c = r.comparison
        if c is None:
            diff, p = "baseline", "-"
        elif isinstance(c, str):
            diff, p = f"n/a ({c})", "-"
        else:
            diff = f"{c.difference:+.4f} ({c.ci[0]:+.4f} to {c.ci[1]:+.4f})"
            p = f"{c.p:.3g} / {r.p_holm:.3g}"
        std = f" ± {r.std:.4f}" if r.std is not None else ""
        body.append(
            [r.size or "-", f"{r.steps} / {r.tokens:,.0f}", r.arm, f"{r.mean:.4f}{std} (n={r.n})", diff, p]
        )
    L += [
        "",
        table(
            ["size", "budget (steps / tokens)", "arm", "final", f"vs {s.baseline} (95% CI)", "p / p Holm"],
            body,
        ),
    ]
    L += ["", "### Loss against tokens: L(D) = E + A D^-alpha", ""]
    L.append(
        "Fitted to the seed means at each budget (mars.analysis.scaling; 95% intervals: the paired jackknife "
        "over seeds, every fit redone per left-out seed). "
        + (
            "With 3 budgets the curve has as many points as parameters and passes through them: the "
            "intervals then hold only the seeds' spread."
            if len(ladder.budgets) <= 3
            else f"{len(ladder.budgets)} budgets leave {len(ladder.budgets) - 3} point(s) to spare. An E at "
            "its bound 0 with an interval spanning orders of magnitude means the losses do not yet bend to "
            "a floor in this range: E and the extrapolation are not determined."
        )
    )
    body = [[z.name or "-", arm, *_fit_cell(an.loss_fits[(arm, z.name)], an.loss_intervals[(arm, z.name)])]
            for z in ladder.sizes for arm in ladder.arms]  # fmt: skip
    L += ["", table(["size", "arm", "E", "A", "alpha"], body)]
    L += ["", "### Effective-data speedup", ""]
    L.append(
        f"The tokens {s.baseline}'s fitted curve needs to reach the arm's fitted loss at D, over D (>1: the "
        "arm needs less data); at each budget, and beyond the largest as an extrapolation of both fits, "
        "labelled with its factor. Per second: that speedup times the arm's throughput over "
        f"{s.baseline}'s at the same size (tokens per training second of the trunks, evaluations and "
        f"compilation left out; {_hardware(arms)})."
    )
    body = []
    for (arm, size), pts in an.speedups.items():
        curve = an.speedup_curves.get((arm, size), [])
        ratio = (
            rates[(arm, size)] / rates[(s.baseline, size)]
            if (arm, size) in rates and (s.baseline, size) in rates
            else None
        )
        for p in [*pts, *(curve[-1:] if curve else [])]:
            val = f"{p.value:.3f} {_iv(p.interval)}" if p.value is not None else f"none: {p.why}"
            per_s = "-" if p.value is None or ratio is None else f"{p.value * ratio:.3f}"
            body.append(
                [
                    size or "-",
                    arm,
                    f"{p.d:,.0f}",
                    val,
                    per_s,
                    extrapolation_label(p.extrapolation) or "measured",
                ]
            )
    L += [
        "",
        table(["size", "arm", "D (tokens)", "speedup per token (95% CI)", "per second", "range"], body)
        if body
        else "- no arm besides the baseline",
    ]
    costs = profile_costs(ladder, rates)
    profile_lines, profile_figs, profile_json = _profile(costs, out, s, title, table)
    L += profile_lines
    if len(ladder.sizes) > 1:
        L += ["", "### Loss against model size: L(N) = E + A N^-alpha (N: non-embedding parameters)", ""]
        body = [[arm, str(steps), *_fit_cell(f)] for (arm, steps), f in an.size_fits.items()]
        L += [table(["arm", "budget (steps)", "E", "A", "alpha"], body)]
    figs = scaling_figures(out, ladder, an) + profile_figs
    js = _json(ladder, an, rows)
    js["throughput"] = [{"arm": a, "size": z, "tokens_per_s": v} for (a, z), v in rates.items()]
    js["performance_profile"] = profile_json
    return L, figs, js


def _hardware(arms) -> str:
    """The hardware the finals' seconds were measured on, in words."""
    from mars.analysis.runs import load_run

    seen = {
        h
        for rep in arms
        for t in rep.final
        if t.dir and Path(t.dir).is_dir()
        for h in load_run(Path(t.dir)).hardware
    }
    if not seen:
        return "no run names its hardware"
    return "measured on " + "; ".join(sorted(seen))


def _profile(costs: dict, out: Path, s, title: str, table) -> tuple[list[str], list[Path], dict]:
    """The performance profile's lines, figure and JSON (mars.analysis.profile)."""
    from mars.analysis.profile import TAUS, profile, profile_figure, ratios

    curves = {what: ratios(c) for what, c in costs.items() if c}
    if not curves.get("tokens") or len(curves["tokens"]) < 2:
        return [], [], {}
    L = ["", "### Performance profile", ""]
    L.append(
        f"Over the {len(costs['tokens'])} cells (size x budget): each cell's target is **{s.baseline}**'s "
        f"median final {title} there; an arm's cost is the tokens (or training seconds) its median final "
        "value over the budgets takes to reach it (linear in tokens between budgets; at the smallest budget "
        "already: that budget's tokens, an upper bound; beyond the largest: never). rho(tau) is the share "
        "of cells where the arm's cost is within a factor tau of the best arm's (AlgoPerf's performance "
        "profile; `performance_profile.png`)."
    )
    body = [
        [what, arm, *(f"{profile(r, tau):.2f}" for tau in TAUS)]
        for what, by_arm in curves.items()
        for arm, r in by_arm.items()
    ]
    L += ["", table(["cost", "arm", *(f"rho({tau:g})" for tau in TAUS)], body)]
    figs = profile_figure(out / "performance_profile.png", curves, f"performance profile: {s.name}")
    js = {
        what: {
            "cells": {
                cell: {a: (c if c != math.inf else None) for a, c in by_arm.items()}
                for cell, by_arm in costs[what].items()
            },
            "rho": {arm: {f"{tau:g}": profile(r, tau) for tau in TAUS} for arm, r in by_arm_ratios.items()},
        }
        for what, by_arm_ratios in curves.items()
    }
    return L, figs, js


def _wall(arms) -> tuple[float, float] | None:
    trunk = sum(
        float(t.attrs.get("process_s", 0.0)) for r in arms for t in r.final if t.attrs.get("role") == "trunk"
    )
    branch = sum(
        float(t.attrs.get("process_s", 0.0)) for r in arms for t in r.final if t.attrs.get("role") == "branch"
    )
    return (trunk, branch) if trunk or branch else None


def _json(ladder: Ladder, an: Analysis, rows) -> dict:
    def fit(f):
        return (
            {"reason": f} if isinstance(f, str) else {"E": f.c, "A": f.a, "alpha": f.b, "points": f.n_points}
        )

    def iv(x):
        return {"reason": x} if isinstance(x, str) else {"low": x.low, "high": x.high, "method": x.method}

    def point(arm, size, p):
        return {"arm": arm, "size": size, "tokens": p.d, "speedup": p.value, "why": p.why,
                "interval": iv(p.interval), "extrapolation": p.extrapolation}  # fmt: skip

    return {
        "sizes": [
            {"name": z.name, "tokens_per_step": z.tokens_per_step, "params": z.params} for z in ladder.sizes
        ],
        "table": [
            {
                "arm": r.arm,
                "size": r.size,
                "steps": r.steps,
                "tokens": r.tokens,
                "mean": r.mean,
                "std": r.std,
                "n": r.n,
                "p_holm": r.p_holm,
                "difference": None
                if r.comparison is None or isinstance(r.comparison, str)
                else r.comparison.difference,
            }
            for r in rows
        ],  # fmt: skip
        "loss_fits": [
            {
                "arm": a,
                "size": z,
                **fit(f),
                "intervals": {k: iv(v) for k, v in an.loss_intervals[(a, z)].items()},
            }
            for (a, z), f in an.loss_fits.items()
        ],  # fmt: skip
        "size_fits": [{"arm": a, "steps": st, **fit(f)} for (a, st), f in an.size_fits.items()],
        "speedups": [point(a, z, p) for (a, z), pts in an.speedups.items() for p in pts],
        "speedup_curves": [point(a, z, p) for (a, z), pts in an.speedup_curves.items() for p in pts],
    }
