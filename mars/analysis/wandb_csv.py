"""Runs from Weights & Biases CSV exports, as run tables (mars.analysis.runs.Run) like run dirs give.

Two layouts: a run's history (one column per metric: "train/loss", "val/loss", ...; "_step",
"_runtime" and an optional "tokens") and a chart export ("RUN - METRIC" columns, "RUN -
METRIC__MIN/__MAX" bands, a "Step" column). Every numeric metric column is kept, so --metric works
on exports too. Tokens come from a "tokens" column, else step x tokens_per_step.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from mars.analysis.runs import Point, Run
from mars.metrics_jsonl import to_float

STEP_COLUMNS = ("step", "_step", "Step", "iter")
NOT_METRICS = ("tokens", "time")  # axes; W&B's own columns start with "_"


def read_wandb_csv(path: Path, tokens_per_step: float) -> list[Run]:
    """The runs of one CSV export, labelled by their W&B names (the file's stem for a history)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return []
    cols = list(rows[0])
    step_col = next((c for c in STEP_COLUMNS if c in cols), None)
    time_col = "time" if "time" in cols else "_runtime"

    def num(row: dict, col: str | None) -> float:
        v = to_float(row.get(col, "")) if col else None
        return math.nan if v is None else v

    runs: dict[str, Run] = {}
    for row in rows:
        step = num(row, step_col)
        tokens = num(row, "tokens")
        if not math.isfinite(tokens):
            tokens = step * tokens_per_step
        seconds = num(row, time_col)
        for col in cols:
            if (
                col == step_col
                or col in NOT_METRICS
                or col.startswith("_")
                or col.endswith(("__MIN", "__MAX"))
            ):
                continue
            name, sep, key = col.rpartition(" - ")
            name, key = (name, key) if sep else (path.stem, col)
            value = num(row, col)
            if math.isfinite(value) and math.isfinite(tokens):
                run = runs.setdefault(name, Run(path=path, sweep=path.parent, label=name, has_metrics=True))
                run.add(key, Point(step, tokens, seconds, value))
                run.last_tokens = max(run.last_tokens, tokens)
    return list(runs.values())
