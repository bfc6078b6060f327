"""The MARS paper's zero-shot table: one row per model, one column per task, then the average.

Metric per column (lm-eval 0-shot, scores in percent). We follow the convention of the GPT-2 /
FineWeb-Edu zero-shot tables the paper's numbers come from (e.g. OBQA 30.6 and ARC-C 26.5 for
GPT-2 small are length-normalised accuracies; plain accuracy is near 17-20 there):

    acc_norm  ARC-E, ARC-C, HellaSwag, OBQA, PIQA, SciQ   (the tasks where lm-eval reports it)
    acc       BoolQ, WinoGrande, MMLU                      (lm-eval reports only acc; MMLU is the
                                                            size-weighted mean of its 57 subjects)

Tasks outside the paper's nine get a column of their own with acc_norm when lm-eval reports
it, else acc. Avg is the unweighted mean of a row's columns; when a row lacks some of the
columns shown it is the mean over the ones it has and is marked with "*".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Scores = Mapping[str, Mapping[str, float]]


@dataclass(frozen=True)
class Column:
    task: str  # lm-eval task or group name
    header: str
    metric: str


PAPER_COLUMNS: tuple[Column, ...] = (
    Column("arc_easy", "ARC-E", "acc_norm"),
    Column("arc_challenge", "ARC-C", "acc_norm"),
    Column("boolq", "BoolQ", "acc"),
    Column("hellaswag", "HellaSwag", "acc_norm"),
    Column("openbookqa", "OBQA", "acc_norm"),
    Column("piqa", "PIQA", "acc_norm"),
    Column("winogrande", "WG", "acc"),
    Column("mmlu", "MMLU", "acc"),
    Column("sciq", "SciQ", "acc_norm"),
)
PREFERRED_METRICS = ("acc_norm", "acc", "exact_match", "f1")
MISSING = "-"
PARTIAL = "*"


def columns_for(rows: Sequence[tuple[str, Scores]]) -> list[Column]:
    """The paper's columns any row has a score for (paper order), then the other tasks."""
    have = {task for _, scores in rows for task, metrics in scores.items() if metrics}
    columns = [c for c in PAPER_COLUMNS if c.task in have]
    paper = {c.task for c in PAPER_COLUMNS}
    for _, scores in rows:
        for task, metrics in scores.items():
            if task in paper or not metrics or any(c.task == task for c in columns):
                continue
            names = [m for rs in rows for m in rs[1].get(task, {})]
            metric = next((m for m in PREFERRED_METRICS if m in names), sorted(names)[0])
            columns.append(Column(task, task, metric))
    return columns


def row_values(scores: Scores, columns: Sequence[Column]) -> tuple[list[float | None], float | None, bool]:
    """Percent scores per column (None where missing), their mean, and whether any was missing."""
    values = []
    for c in columns:
        v = scores.get(c.task, {}).get(c.metric)
        values.append(None if v is None else 100.0 * v)
    present = [v for v in values if v is not None]
    avg = sum(present) / len(present) if present else None
    return values, avg, len(present) < len(values)


def _cells(rows: Sequence[tuple[str, Scores]], columns: Sequence[Column]) -> list[list[str]]:
    out = []
    for name, scores in rows:
        values, avg, partial = row_values(scores, columns)
        cells = [MISSING if v is None else f"{v:.2f}" for v in values]
        avg_cell = MISSING if avg is None else f"{avg:.2f}" + (PARTIAL if partial else "")
        out.append([name, *cells, avg_cell])
    return out


def footnote(columns: Sequence[Column], partial: bool) -> str:
    note = "Zero-shot accuracy (%) from lm-eval, metric per column as shown; Avg = unweighted column mean."
    if partial:
        note += f" {PARTIAL} = mean over the columns the row has ({MISSING} = not evaluated)."
    return note


def markdown_table(rows: Sequence[tuple[str, Scores]]) -> str:
    """GitHub markdown: header cells "ARC-E (acc_norm)", one row per model, a footnote line."""
    columns = columns_for(rows)
    header = ["Model", *[f"{c.header} ({c.metric})" for c in columns], "Avg"]
    body = _cells(rows, columns)
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" + "---:|" * (len(header) - 1),
        *["| " + " | ".join(r) + " |" for r in body],
        "",
        footnote(columns, any(r[-1].endswith(PARTIAL) for r in body)),
    ]
    return "\n".join(lines) + "\n"


def console_table(rows: Sequence[tuple[str, Scores]]) -> str:
    """Aligned plain text: a header line, a metric line under it, one line per model."""
    columns = columns_for(rows)
    header = ["Model", *[c.header for c in columns], "Avg"]
    metrics = ["", *[c.metric for c in columns], ""]
    body = _cells(rows, columns)
    table = [header, metrics, *body]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]

    def fmt(r: list[str]) -> str:
        cells = [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        return "  ".join([r[0].ljust(widths[0]), *cells]).rstrip()

    lines = [fmt(header), fmt(metrics), "-" * len(fmt(header)), *[fmt(r) for r in body]]
    lines.append(footnote(columns, any(r[-1].endswith(PARTIAL) for r in body)))
    return "\n".join(lines) + "\n"
