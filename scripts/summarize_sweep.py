"""Summarize a Hydra sweep: final and best validation loss per combination of swept values.

    python train.py -m optimizer.gamma=0,0.0125,0.025,0.05 optimizer.lr=3e-3,6e-3
    python scripts/summarize_sweep.py multirun/2025-01-01/12-00-00

Prints a table (one row per job, sorted by best val loss), writes MULTIRUN_DIR/summary.csv and,
when exactly two keys were swept, a heatmap of the best val loss (MULTIRUN_DIR/summary_heatmap.png).
Each job dir is found by its .hydra/overrides.yaml; its losses come from its metrics.jsonl.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

import yaml

COLUMNS = ("final_val_loss", "best_val_loss", "final_train_loss", "steps", "tokens")


def find_jobs(root: Path) -> list[Path]:
    """Job dirs under root (the root itself when it is one job)."""
    return sorted({p.parent.parent for p in root.glob("**/.hydra/overrides.yaml")}, key=_job_sort_key)


def _job_sort_key(path: Path):
    head = path.name.split("_", 1)[0]
    return (int(head), str(path)) if head.isdigit() else (math.inf, str(path))


def read_overrides(job: Path) -> dict[str, str]:
    items = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()) or []
    out = {}
    for item in items:
        key, _, value = str(item).partition("=")
        key = key.lstrip("+~")
        if not key.startswith("hydra.") and not key.startswith("hydra/"):
            out[key] = value
    return out


def read_losses(job: Path) -> dict[str, float | int | None]:
    """Final and best val loss, final train loss, steps and tokens of one job's metrics.jsonl."""
    path = job / "metrics.jsonl"
    val, train, step, tokens = [], [], 0, 0
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a killed run
            step, tokens = max(step, rec.get("step", 0)), max(tokens, rec.get("tokens", 0))
            if _finite(rec.get("val/loss")):
                val.append(float(rec["val/loss"]))
            if _finite(rec.get("train/loss")):
                train.append(float(rec["train/loss"]))
    return {
        "final_val_loss": val[-1] if val else None,
        "best_val_loss": min(val) if val else None,
        "final_train_loss": train[-1] if train else None,
        "steps": step,
        "tokens": tokens,
    }


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _as_number(v: str):
    try:
        return float(v)
    except ValueError:
        return v


def _value_key(v: str):
    n = _as_number(v)
    return (0, n, "") if isinstance(n, float) else (1, 0.0, n)


def summarize(root: Path) -> tuple[list[str], list[dict]]:
    """(swept keys, one row per job): the keys whose value differs between jobs, and the losses."""
    jobs = find_jobs(root)
    if not jobs:
        raise SystemExit(f"error: no Hydra job dirs (with .hydra/overrides.yaml) under {root}")
    overrides = [read_overrides(j) for j in jobs]
    keys = sorted({k for o in overrides for k in o})
    swept = [k for k in keys if len({o.get(k) for o in overrides}) > 1]
    rows = []
    for job, o in zip(jobs, overrides, strict=True):
        rows.append({**{k: o.get(k, "") for k in swept}, **read_losses(job), "run_dir": str(job)})
    return swept, rows


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}"
    return str(v)


def format_table(swept: list[str], rows: list[dict]) -> str:
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


def heatmap(path: Path, swept: list[str], rows: list[dict], metric: str = "best_val_loss") -> None:
    """Rows: values of swept[0]; columns: values of swept[1]; cell: the metric (lower is better)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ky, kx = swept
    ys = sorted({r[ky] for r in rows}, key=_value_key)
    xs = sorted({r[kx] for r in rows}, key=_value_key)
    grid = np.full((len(ys), len(xs)), np.nan)
    for r in rows:
        if r[metric] is not None:
            grid[ys.index(r[ky]), xs.index(r[kx])] = r[metric]
    fig, ax = plt.subplots(figsize=(1.3 * len(xs) + 2.5, 0.8 * len(ys) + 2))
    im = ax.imshow(grid, cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(len(xs)), xs)
    ax.set_yticks(range(len(ys)), ys)
    ax.set_xlabel(kx)
    ax.set_ylabel(ky)
    finite = grid[np.isfinite(grid)]
    best = finite.min() if finite.size else None
    for i in range(len(ys)):
        for j in range(len(xs)):
            if np.isfinite(grid[i, j]):
                weight = "bold" if grid[i, j] == best else "normal"
                ax.text(j, i, f"{grid[i, j]:.3f}", ha="center", va="center", color="w", fontweight=weight)
    fig.colorbar(im, ax=ax, label=metric.replace("_", " "))
    ax.set_title(f"{metric.replace('_', ' ')} per combination")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("multirun_dir", type=Path, help="a Hydra sweep dir (multirun/DATE/TIME)")
    p.add_argument("--csv", type=Path, help="CSV path (default MULTIRUN_DIR/summary.csv)")
    p.add_argument(
        "--heatmap", type=Path, help="heatmap path for 2-D sweeps (default MULTIRUN_DIR/summary_heatmap.png)"
    )
    p.add_argument("--metric", default="best_val_loss", choices=["best_val_loss", "final_val_loss"])
    args = p.parse_args(argv)
    root = args.multirun_dir
    if not root.is_dir():
        print(f"error: {root} is not a directory", file=sys.stderr)
        return 2
    swept, rows = summarize(root)
    print(format_table(swept, rows))
    csv_path = args.csv or root / "summary.csv"
    write_csv(csv_path, swept, rows)
    print(f"\nwrote {csv_path}")
    if len(swept) == 2:
        png = args.heatmap or root / "summary_heatmap.png"
        heatmap(png, swept, rows, args.metric)
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
