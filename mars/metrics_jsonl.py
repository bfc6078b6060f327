"""metrics.jsonl, the file between the trainer and the analysis tools: its one reader and encoder.

One JSON object per line. Every line has "step" and "tokens"; training lines add "train/loss",
"lr", "grad_norm", "time", ...; evaluation lines "val/loss"; in-loop downstream evaluations
"downstream/TASK/METRIC"; any other key a trainer logs is just another column. JSON has no NaN or
infinity, so non-finite floats are written as the strings "nan", "inf" and "-inf" and read back as
floats (to_float). A run killed while writing leaves a last line cut short: reading skips it. Any
other line that is not a JSON object was damaged after it was written: read_metrics raises
CorruptLineError naming the file and the line (the analysis tools refuse the file with that line;
the trainer, which must resume whatever happened, keeps the line and warns: mars.train.metrics).

Standard library only, so that mars.analysis reads run dirs without torch; mars.train.metrics
writes through encode_line().
"""

from __future__ import annotations

import json
import math
import os
import shlex
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


class CorruptLineError(ValueError):
    """A line of metrics.jsonl, other than the last, that is not a JSON object."""


def metrics_path(path: str | os.PathLike) -> Path:
    """A metrics.jsonl given as itself or as its run dir."""
    p = Path(path)
    return p / METRICS_FILE if p.is_dir() else p


def metrics_lines(path: str | os.PathLike) -> list[tuple[int, str, dict | None]]:
    """(line number, text, record) of every non-blank line, record None when the line is not a JSON
    object, without a last line cut short by a kill (the file's last line when it is not one). Bytes
    that are not UTF-8 are kept as surrogates (encode with errors="surrogateescape")."""
    lines = []
    for number, raw in enumerate(metrics_path(path).read_bytes().split(b"\n"), 1):
        text = raw.decode("utf-8", errors="surrogateescape")  # bytes that are not UTF-8 survive a rewrite
        if not text.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        lines.append((number, text, record if isinstance(record, dict) else None))
    if lines and lines[-1][2] is None:
        lines.pop()  # torn by a kill
    return lines


def corrupt_line_message(path: str | os.PathLike, number: int, text: str) -> str:
    snippet = text if len(text) <= 40 else text[:40] + "..."
    return (
        f"{metrics_path(path)} line {number} is not a JSON object ({snippet!r}): a line in the middle of the "
        f"file was damaged after it was written"
    )


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics.jsonl (or of RUN_DIR/metrics.jsonl) in file order. A last line cut short
    by a kill is skipped; any other line that is not a JSON object raises CorruptLineError."""
    records = []
    for number, text, record in metrics_lines(path):
        if record is None:
            raise CorruptLineError(
                f"{corrupt_line_message(path, number, text)}; repair or delete that line "
                f"(e.g. sed -i {number}d {shlex.quote(str(metrics_path(path)))})"
            )
        records.append(record)
    return records
