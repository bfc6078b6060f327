"""Loss curves for plot_curves: from run dirs (metrics.jsonl) and from Weights & Biases CSV exports."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mars.analysis.errors import AnalysisError
from mars.analysis.groups import overrides_view
from mars.analysis.labels import Item, common_description, describe, label, varying_columns
from mars.analysis.runs import METRICS, read_config, read_metrics, to_float
from mars.analysis.settings import settings_of


@dataclass
class Curve:
    label: str
    train: list[tuple[float, float, float]] = field(default_factory=list)  # (tokens, seconds, loss)
    val: list[tuple[float, float, float]] = field(default_factory=list)
    paper_key: tuple[str, str] | None = None


def read_run(run_dir: Path, cfg: dict | None = None) -> Curve:
    """A run dir's curves, labelled on its own (describe); finite losses only."""
    path = run_dir / METRICS
    if not path.is_file():
        raise AnalysisError(f"{path} not found (expected a run dir written by train.py)")
    text, paper = describe(read_config(run_dir) if cfg is None else cfg)
    curve = Curve(label=text, paper_key=paper)
    for rec in read_metrics(path):
        tokens = to_float(rec.get("tokens"))
        seconds = to_float(rec.get("time"))
        tokens = 0.0 if tokens is None else tokens
        seconds = math.nan if seconds is None else seconds
        for key, dest in (("train/loss", curve.train), ("val/loss", curve.val)):
            v = to_float(rec.get(key))
            if v is not None and math.isfinite(v):
                dest.append((tokens, seconds, v))
    return curve


def run_labels(run_dirs: Sequence[Path]) -> tuple[list[str], str]:
    """Per run, a label naming only what differs between these runs (seeds included), and the
    description they share (the legend's title). A single run keeps its stand-alone label."""
    from mars.analysis.runs import Run, load_run

    runs: list[Run] = [load_run(p, p.parent, with_metrics=False) for p in run_dirs]
    if len(runs) == 1:
        return [describe(runs[0].config)[0]], ""
    items = [Item(settings_of(r.flat, keep_seeds=True), overrides_view(r, keep_seeds=True)) for r in runs]
    columns = varying_columns(items)
    return [label(columns, it) for it in items], common_description(columns, items)


def disambiguate(curves: list[Curve], dirs: list[Path]) -> None:
    """Runs whose labels coincide (the same settings, or nothing that differs) get their dir's name."""
    counts: dict[str, int] = {}
    for c in curves:
        counts[c.label] = counts.get(c.label, 0) + 1
    for c, path in zip(curves, dirs, strict=True):
        if counts[c.label] > 1 or not c.label:
            name = path.resolve().name
            c.label = f"{c.label} [{name}]" if c.label else name


def read_wandb_csv(path: Path, tokens_per_step: float) -> list[Curve]:
    """Curves from a W&B CSV export: run history (one run) or chart export ("RUN - metric" columns)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return []
    cols = list(rows[0])
    step_col = next((c for c in ("step", "_step", "Step", "iter") if c in cols), None)

    def num(row: dict, col: str | None) -> float:
        v = to_float(row.get(col, "")) if col else None
        return math.nan if v is None else v

    curves: dict[str, Curve] = {}
    for row in rows:
        tokens = num(row, "tokens")
        if not math.isfinite(tokens):
            tokens = num(row, step_col) * tokens_per_step if step_col else math.nan
        seconds = num(row, "time") if "time" in cols else num(row, "_runtime")
        for col in cols:
            if col.endswith(("__MIN", "__MAX")):
                continue
            run, sep, metric = col.rpartition(" - ")
            run = run if sep else path.stem
            metric = metric if sep else col
            if metric not in ("train/loss", "val/loss"):
                continue
            v = num(row, col)
            if math.isfinite(v) and math.isfinite(tokens):
                c = curves.setdefault(run, Curve(label=run))
                (c.train if metric == "train/loss" else c.val).append((tokens, seconds, v))
    return list(curves.values())
