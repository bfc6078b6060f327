"""mars.analysis: reading run dirs, comparing optimizers over seeds, and drawing the figures.

    from mars.analysis import build_report, write_report
    report = build_report([Path("multirun/2025-01-01/12-00-00")], baseline=["optimizer.name=adamw"])
    write_report(report, Path("report"))        # report.md, report.json, report_curves.png, ...

Modules, one concern each: runs (the run table: config, overrides and every logged metric of a run
dir), wandb_csv (the same table from W&B CSV exports), metric (which way a metric is better, by
name), settings (which config keys are settings, seeds, bookkeeping), labels (what a legend entry
or table row says), groups (pooling seeds, the comparability check, the baseline, seed pairing),
stats (tokens to target, the L(D) fit), significance (paired and Welch tests, Holm, power),
intervals (jackknife intervals of the speedups), plots (figures), report (the report itself),
summary (summarize_sweep's table), paper (the paper's reference losses), cli (the scripts' command
lines). metrics.jsonl itself is read by mars.metrics_jsonl, shared with the trainer. Only numpy,
scipy, matplotlib and PyYAML are needed: no torch.
"""

from mars.analysis.metric import Metric, metric_of
from mars.analysis.report import Report, build_report, markdown_table, render_markdown, to_json, write_report
from mars.analysis.runs import Run, find_run_dirs, load_run, load_runs
from mars.analysis.significance import Comparison, Welch, compare, holm, welch
from mars.analysis.stats import PowerLaw, fit_power_law, mean_curve, tokens_to_target
from mars.errors import UserError

__all__ = [
    "UserError",
    "Comparison",
    "Metric",
    "PowerLaw",
    "Report",
    "Run",
    "Welch",
    "build_report",
    "compare",
    "find_run_dirs",
    "fit_power_law",
    "holm",
    "load_run",
    "load_runs",
    "markdown_table",
    "mean_curve",
    "metric_of",
    "render_markdown",
    "to_json",
    "tokens_to_target",
    "welch",
    "write_report",
]
