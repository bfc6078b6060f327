"""The paper-layout table: column order, metric per column, percentages, Avg, partial rows."""

from mars.eval.tables import PAPER_COLUMNS, columns_for, console_table, markdown_table, row_values

# The MARS paper's AdamW row (GPT-2 small, FineWeb-Edu), as lm-eval fractions.
PAPER_ADAMW = [51.43, 26.54, 55.78, 36.26, 30.60, 64.53, 50.36, 24.49, 71.50]


def paper_scores(values):
    scores = {}
    for col, v in zip(PAPER_COLUMNS, values, strict=True):
        other = "acc" if col.metric == "acc_norm" else "acc_norm"
        scores[col.task] = {col.metric: v / 100, other: 0.0}  # the other metric must not be used
    scores["mmlu"].pop("acc_norm")
    return scores


def test_paper_row_reproduces_the_paper_average():
    values, avg, partial = row_values(paper_scores(PAPER_ADAMW), PAPER_COLUMNS)
    assert [round(v, 2) for v in values] == PAPER_ADAMW
    assert round(avg, 2) == 45.72 and not partial  # the paper's Avg for AdamW


def test_markdown_layout_states_the_metric_per_column():
    md = markdown_table([("adamw@100000", paper_scores(PAPER_ADAMW))])
    lines = md.splitlines()
    assert lines[0] == (
        "| Model | ARC-E (acc_norm) | ARC-C (acc_norm) | BoolQ (acc) | HellaSwag (acc_norm) | "
        "OBQA (acc_norm) | PIQA (acc_norm) | WG (acc) | MMLU (acc) | SciQ (acc_norm) | Avg |"
    )
    assert lines[1] == "|---|" + "---:|" * 10
    assert lines[2] == (
        "| adamw@100000 | 51.43 | 26.54 | 55.78 | 36.26 | 30.60 | 64.53 | 50.36 | 24.49 | 71.50 | 45.72 |"
    )
    assert "Zero-shot accuracy (%)" in md and "*" not in lines[2]


def test_compare_rows_partial_rows_and_extra_tasks():
    a = paper_scores(PAPER_ADAMW)
    b = {"arc_easy": {"acc": 0.1, "acc_norm": 0.5}, "mars_quiz": {"acc": 0.25, "acc_norm": 0.75}}
    rows = [("A", a), ("B", b)]
    cols = columns_for(rows)
    assert [c.header for c in cols] == [c.header for c in PAPER_COLUMNS] + ["mars_quiz"]
    assert cols[-1].metric == "acc_norm"
    md = markdown_table(rows).splitlines()
    assert md[0].endswith("| SciQ (acc_norm) | mars_quiz (acc_norm) | Avg |")
    assert md[2].startswith("| A | 51.43 |") and md[2].endswith("| 71.50 | - | 45.72* |")
    assert md[3] == "| B | 50.00 | - | - | - | - | - | - | - | - | 75.00 | 62.50* |"
    assert "* = mean over the columns the row has" in md[-1]


def test_only_requested_columns_and_console_alignment():
    rows = [
        ("run_a@10", {"mars_quiz": {"acc": 0.325, "acc_norm": 0.3}}),
        ("b@20", {"mars_quiz": {"acc": 0.5}}),
    ]
    text = console_table(rows).splitlines()
    assert text[0].split() == ["Model", "mars_quiz", "Avg"]
    assert text[1].split() == ["acc_norm"]
    assert text[3].split() == ["run_a@10", "30.00", "30.00"]
    assert text[4].split() == ["b@20", "-", "-"]  # no acc_norm for b: missing, not silently acc
    # right-aligned columns: header, metric and score of a column end at the same position
    ends = {text[0].index("mars_quiz") + 9, text[1].index("acc_norm") + 8, text[3].index("30.00") + 5}
    assert len(ends) == 1
    assert text[0].endswith("Avg") and text[3].endswith("30.00") and len(text[0]) == len(text[3])
