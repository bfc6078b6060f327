"""scripts/summarize_sweep.py's per-job table: final and best loss of every job, one row each.

Unlike the report (mars.analysis.report), nothing is pooled: seeds are rows of their own, and a
job that has not evaluated yet is shown with empty losses rather than refused, so the table can be
watched while a sweep runs.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from mars.analysis.errors import AnalysisError
from mars.analysis.groups import value_key
from mars.analysis.plots import heatmap
from mars.analysis.runs import Run, find_run_dirs, load_run

COLUMNS = ("final_val_loss", "best_val_loss", "final_train_loss", "steps", "tokens")


def job_losses(run: Run) -> dict[str, float | int | None]:
    """Final and best val loss, final train loss, steps and tokens of one job (finite losses only)."""
    val = [v for _, v in run.val if math.isfinite(v)]
    train = [v for _, v in run.train if math.isfinite(v)]
    return {
        "final_val_loss": val[-1] if val else None,
        "best_val_loss": min(val) if val else None,
        "final_train_loss": train[-1] if train else None,
        "steps": run.last_step,
        "tokens": int(run.last_tokens) if float(run.last_tokens).is_integer() else run.last_tokens,
    }


def summarize(root: Path) -> tuple[list[str], list[dict]]:
    """(swept keys, one row per job): the override keys whose value differs between jobs, and the losses."""
    jobs = [load_run(path, root) for path in find_run_dirs(root)]
    if not jobs:
        raise AnalysisError(f"no Hydra job dirs (with .hydra/config.yaml) under {root}")
    keys = sorted({k for job in jobs for k in job.overrides})
    swept = [k for k in keys if len({job.overrides.get(k) for job in jobs}) > 1]
    rows = [
        {**{k: job.overrides.get(k, "") for k in swept}, **job_losses(job), "run_dir": str(job.path)}
        for job in jobs
    ]
    return swept, rows


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def format_table(swept: list[str], rows: list[dict]) -> str:
    """A plain-text table, best val loss first."""
    cols = [*swept, *COLUMNS]
    ordered = sorted(rows, key=lambda r: (r["best_val_loss"] is None, r["best_val_loss"] or 0.0))
    cells = [[_fmt(r[c]) for c in cols] for r in ordered]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def write_csv(path: Path, swept: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*swept, *COLUMNS, "run_dir"])
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in r.items()})


def write_heatmap(path: Path, swept: list[str], rows: list[dict], metric: str = "best_val_loss") -> None:
    """Rows: values of swept[0]; columns: values of swept[1]; cell: the metric (mean ± std if repeated)."""
    ky, kx = swept
    cells: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r[metric] is not None:
            cells.setdefault((r[ky], r[kx]), []).append(r[metric])
    ys = sorted({r[ky] for r in rows}, key=value_key)
    xs = sorted({r[kx] for r in rows}, key=value_key)
    name = metric.replace("_", " ")
    heatmap(path, ky, kx, cells, name, ys, xs, title=f"{name} per combination")
