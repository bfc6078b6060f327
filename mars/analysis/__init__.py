"""mars.analysis: reading run dirs, comparing optimizers over seeds, and drawing the figures.

    from mars.analysis import build_report, write_report
    report = build_report([Path("multirun/2025-01-01/12-00-00")], baseline=["optimizer.name=adamw"])
    write_report(report, Path("report"))        # report.md, report.json, report_curves.png, ...

Modules, one concern each: runs (run dirs, configs, metrics.jsonl), settings (which config keys
are settings, seeds, bookkeeping), labels (what a legend entry or table row says), groups
(pooling seeds, the comparability check, the baseline), stats (tokens to target, the L(D) fit,
Welch's test), plots (figures), report (the report itself), summary (summarize_sweep's table),
curves (plot_curves' inputs), paper (the paper's reference losses), cli (the scripts' command
lines). Only numpy, scipy, matplotlib and PyYAML are needed: no torch.
"""

from mars.analysis.errors import AnalysisError
from mars.analysis.report import Report, build_report, markdown_table, render_markdown, to_json, write_report
from mars.analysis.runs import Run, find_run_dirs, load_runs
from mars.analysis.stats import PowerLaw, Welch, fit_power_law, mean_curve, tokens_to_target, welch

__all__ = [
    "AnalysisError",
    "PowerLaw",
    "Report",
    "Run",
    "Welch",
    "build_report",
    "find_run_dirs",
    "fit_power_law",
    "load_runs",
    "markdown_table",
    "mean_curve",
    "render_markdown",
    "to_json",
    "tokens_to_target",
    "welch",
    "write_report",
]
