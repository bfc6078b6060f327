"""Summarize a Hydra sweep: final and best validation loss per job, one row each.

    python train.py -m optimizer.gamma=0,0.0125,0.025,0.05 optimizer.lr=3e-3,6e-3
    python scripts/summarize_sweep.py multirun/2025-01-01/12-00-00

Prints a table (one row per job, sorted by best val loss), writes MULTIRUN_DIR/summary.csv and,
when exactly two keys were swept, a heatmap of the best val loss (MULTIRUN_DIR/summary_heatmap.png).
--metric KEY adds any logged metric's final and best value as columns, orders the jobs by it (by
its direction: accuracies highest first) and draws it in the heatmap.
Each job dir is found by its .hydra/config.yaml; its swept values come from .hydra/overrides.yaml,
its losses from its metrics.jsonl. For seeds pooled, speedups and significance tests, use
scripts/report.py. The logic lives in mars.analysis.summary.
"""

from __future__ import annotations

import sys

from mars.analysis.cli import summarize_main
from mars.analysis.summary import COLUMNS, format_table, summarize, write_csv, write_heatmap

__all__ = ["COLUMNS", "format_table", "main", "summarize", "write_csv", "write_heatmap"]


def main(argv: list[str] | None = None) -> int:
    return summarize_main(argv, description=__doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
