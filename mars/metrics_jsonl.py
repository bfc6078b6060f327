"""metrics.jsonl, the file between the trainer and the analysis tools: its one reader and encoder.

One JSON object per line. Every line has "step" and "tokens"; training lines add "train/loss",
"lr", "grad_norm", "time", ...; evaluation lines "val/loss"; in-loop downstream evaluations
"downstream/TASK/METRIC"; any other key a trainer logs is just another column. JSON has no NaN or
infinity, so non-finite floats are written as the strings "nan", "inf" and "-inf" and read back as
floats (to_float). A run killed while writing leaves a last line cut short: reading skips it (and
any other line that is not a JSON object).

Standard library only, so that mars.analysis reads run dirs without torch; mars.train.metrics
writes through encode_line().
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


def jsonable(value: Any) -> Any:
    """A value as strict JSON takes it: tensors and numpy scalars as Python numbers (.item()),
    non-finite floats as "nan" / "inf" / "-inf", containers element by element."""
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item"):
        value = value.item()  # a 0-d tensor or a numpy scalar
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def encode_line(record: dict) -> str:
    """One metrics.jsonl line (newline included)."""
    return json.dumps(jsonable(record), allow_nan=False) + "\n"


def to_float(value: Any) -> float | None:
    """A logged value as a float ("nan" / "inf" strings included); None when it is not a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics.jsonl (or of RUN_DIR/metrics.jsonl) in file order, skipping a line cut
    short by a kill and any other line that is not a JSON object."""
    p = Path(path)
    if p.is_dir():
        p = p / METRICS_FILE
    records = []
    for line in p.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
