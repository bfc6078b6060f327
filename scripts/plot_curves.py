"""Plot training and validation loss (or any logged metric) against tokens and against wall-clock time.

    python scripts/plot_curves.py RUN_DIR [RUN_DIR ...] --out curves.png
    python scripts/plot_curves.py outputs/a outputs/b wandb_export.csv --zoom 20 50 2.8 3.0 --out owt.png
    python scripts/plot_curves.py multirun/sweep --metric mars/grad_cos --metric val/loss --out cos.png

Inputs: run dirs (their metrics.jsonl; the label comes from the run's config) and CSV files
exported from Weights & Biases (a run's history with "train/loss" / "val/loss" / ... columns, or
a chart export with "RUN - val/loss" columns). --metric KEY (repeatable) chooses the panels'
metrics (default: train/loss and val/loss); --direction lower|higher says which way is better
where the name does not (it decides which early values the y range leaves out).

Each curve is labelled with what differs between the runs shown (only keys its own optimizer
reads); what they share is the legend's title. The legend sits below the panels, never over a
curve. When a run matches a paper preset (GPT-2 small / medium / large on OpenWebText with AdamW,
Muon or MARS-AdamW), the paper's best validation losses (docs/algorithms.md) are drawn as
reference markers at 5B, 20B and 50B tokens.
Writes OUT (PNG) and the same figure as PDF next to it. The logic lives in mars.analysis.
"""

from __future__ import annotations

import sys

from mars.analysis.cli import plot_curves_main
from mars.analysis.labels import describe, disambiguate, read_run, run_labels
from mars.analysis.paper import PAPER_BEST_VAL, PAPER_TOKENS
from mars.analysis.plots import plot_curves as plot
from mars.analysis.plots import smooth, time_unit, token_unit
from mars.analysis.runs import Run
from mars.analysis.wandb_csv import read_wandb_csv

Curve = Run  # the name this script's curves had before runs and curves became one table

__all__ = [
    "PAPER_BEST_VAL",
    "PAPER_TOKENS",
    "Curve",
    "Run",
    "describe",
    "disambiguate",
    "main",
    "plot",
    "read_run",
    "read_wandb_csv",
    "run_labels",
    "smooth",
    "time_unit",
    "token_unit",
]


def main(argv: list[str] | None = None) -> int:
    return plot_curves_main(argv, description=__doc__.split("\n\n")[0])


if __name__ == "__main__":
    sys.exit(main())
