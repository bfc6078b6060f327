"""The study report's section on budgets and sizes (study.md "Budgets and sizes", study.json "ladder", and
loss_vs_tokens.png, speedup_vs_tokens.png, speedup_vs_size.png): the budget table, the fits and the
speedups of mars.analysis.scaling on the finals of each arm's best finalist."""

from __future__ import annotations

import math
from pathlib import Path

from mars.analysis.scaling import Analysis, Ladder, SizeInfo, analyse, budget_table, extrapolation_label

UNRESOLVED = 100.0  # an interval wider than this factor is marked "unresolved"


def ladder_of(driver, arms) -> Ladder:
    """The best finalist's finals of every arm (`arms`: the report's ArmReports), by size and budget."""
    cells: dict[tuple[str, str, int], dict[int, float]] = {}
    for rep in arms:
        if rep.best_rank is None:
            continue
        for t in rep.final:
            if int(t.attrs.get("rank", 0)) != rep.best_rank or t.state != "COMPLETE" or "role" not in t.attrs:
                continue
            value = t.value if t.value is not None else math.nan
            cells.setdefault((rep.name, str(t.attrs["size"]), int(t.attrs["steps"])), {})[
                int(t.attrs["seed"])
            ] = value
    sizes = [SizeInfo(z.name, z.tokens_per_step, z.params) for z in driver.sizes]
    return Ladder(cells, sizes, [a.name for a in driver.study.arms], driver.study.baseline)


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


def ladder_section(driver, arms, out: Path, table) -> tuple[list[str], list[Path], dict]:
    """study.md's lines, the figures written, and study.json's "ladder"."""
    from mars.analysis.scaling_plots import scaling_figures
    from mars.study.budgets import budget_lines

    s = driver.study
    ladder = ladder_of(driver, arms)
    an = analyse(ladder)
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
        f"Final {driver.metric.title}, mean ± std over seeds (n); the paired difference to **{s.baseline}** "
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
        "labelled with its factor."
    )
    body = []
    for (arm, size), pts in an.speedups.items():
        curve = an.speedup_curves.get((arm, size), [])
        for p in [*pts, *(curve[-1:] if curve else [])]:
            val = f"{p.value:.3f} {_iv(p.interval)}" if p.value is not None else f"none: {p.why}"
            body.append(
                [size or "-", arm, f"{p.d:,.0f}", val, extrapolation_label(p.extrapolation) or "measured"]
            )
    L += [
        "",
        table(["size", "arm", "D (tokens)", "speedup (95% CI)", "range"], body)
        if body
        else "- no arm besides the baseline",
    ]
    if len(ladder.sizes) > 1:
        L += ["", "### Loss against model size: L(N) = E + A N^-alpha (N: non-embedding parameters)", ""]
        body = [[arm, str(steps), *_fit_cell(f)] for (arm, steps), f in an.size_fits.items()]
        L += [table(["arm", "budget (steps)", "E", "A", "alpha"], body)]
    figs = scaling_figures(out, ladder, an)
    return L, figs, _json(ladder, an, rows)


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
