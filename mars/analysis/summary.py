"""scripts/summarize_sweep.py's per-job table: final and best loss of every job, one row each.

Unlike the report (mars.analysis.report), nothing is pooled: seeds are rows of their own, and a
job that has not evaluated yet is shown with empty losses rather than refused, so the table can be
watched while a sweep runs. Another logged metric (--metric KEY) adds its final and best value as
two more columns, orders the rows and fills the heatmap.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from mars.analysis.groups import value_key
from mars.analysis.metric import Metric, metric_of
from mars.analysis.plots import heatmap
from mars.analysis.runs import Run, find_run_dirs, load_run
from mars.errors import UserError

COLUMNS = ("final_val_loss", "best_val_loss", "final_train_loss", "steps", "tokens")
VAL_LOSS = metric_of("val/loss")


def _final_best(run: Run, m: Metric) -> tuple[float | None, float | None]:
    values = [v for _, _, v in run.points(m.key)]  # finite values only
    return (values[-1], m.best(values)) if values else (None, None)


def metric_columns(m: Metric | None) -> tuple[str, ...]:
    """The extra columns of a --metric KEY other than val/loss: final KEY, best KEY."""
    return () if m is None or m.key == "val/loss" else (f"final {m.key}", f"best {m.key}")


def job_losses(run: Run, m: Metric | None = None) -> dict[str, float | int | None]:
    """Final and best val loss, final train loss, steps and tokens of one job (finite values only),
    and the final and best value of another metric when one is given."""
    final_val, best_val = _final_best(run, VAL_LOSS)
    train = [v for _, _, v in run.points("train/loss")]
    row = {
        "final_val_loss": final_val,
        "best_val_loss": best_val,
        "final_train_loss": train[-1] if train else None,
        "steps": run.last_step,
        "tokens": int(run.last_tokens) if float(run.last_tokens).is_integer() else run.last_tokens,
    }
    if metric_columns(m):
        row.update(zip(metric_columns(m), _final_best(run, m), strict=True))
    return row


def summarize(root: Path, metric: Metric | None = None) -> tuple[list[str], list[dict]]:
    """(swept keys, one row per job): the override keys whose value differs between jobs, and the losses."""
    jobs = [load_run(path, root) for path in find_run_dirs(root)]
    if not jobs:
        raise UserError(f"no Hydra job dirs (with .hydra/config.yaml) under {root}")
    if metric_columns(metric) and not any(metric.key in job.metrics for job in jobs):
        logged = sorted({k for job in jobs for k in job.metrics})
        raise UserError(f"no job under {root} logged {metric.key} (logged: {', '.join(logged) or 'nothing'})")
    keys = sorted({k for job in jobs for k in job.overrides})
    swept = [k for k in keys if len({job.overrides.get(k) for job in jobs}) > 1]
    rows = [
        {**{k: job.overrides.get(k, "") for k in swept}, **job_losses(job, metric), "run_dir": str(job.path)}
        for job in jobs
    ]
    return swept, rows


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def sort_key(metric: Metric | None):
    """Rows best first: by best val loss, or by the best value of another --metric."""
    column = metric_columns(metric)[1] if metric_columns(metric) else "best_val_loss"
    sign = -1.0 if metric is not None and metric.higher_is_better and column != "best_val_loss" else 1.0
    return lambda r: (r.get(column) is None or not math.isfinite(r[column]), sign * (r.get(column) or 0.0))


def format_table(swept: list[str], rows: list[dict], metric: Metric | None = None) -> str:
    """A plain-text table, best first."""
    cols = [*swept, *COLUMNS, *metric_columns(metric)]
    ordered = sorted(rows, key=sort_key(metric))
    cells = [[_fmt(r[c]) for c in cols] for r in ordered]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def write_csv(path: Path, swept: list[str], rows: list[dict], metric: Metric | None = None) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*swept, *COLUMNS, *metric_columns(metric), "run_dir"])
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in r.items()})


def write_heatmap(
    path: Path,
    swept: list[str],
    rows: list[dict],
    metric: str = "best_val_loss",
    higher_is_better: bool = False,
) -> None:
    """Rows: values of swept[0]; columns: values of swept[1]; cell: the metric column (mean ± std if
    repeated)."""
    ky, kx = swept
    cells: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r[metric] is not None:
            cells.setdefault((r[ky], r[kx]), []).append(r[metric])
    ys = sorted({r[ky] for r in rows}, key=value_key)
    xs = sorted({r[kx] for r in rows}, key=value_key)
    name = metric.replace("_", " ") if metric in COLUMNS else metric
    heatmap(
        path, ky, kx, cells, name, ys, xs, title=f"{name} per combination", higher_is_better=higher_is_better
    )
