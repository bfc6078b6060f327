"""The command lines of scripts/report.py, scripts/plot_curves.py and scripts/summarize_sweep.py.

Each main(argv) returns an exit status: 0, or 2 after printing one line ``error: ...`` on stderr
for input it cannot use (no traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from mars.errors import UserError


def _fail(e: Exception) -> int:
    print(f"error: {e}", file=sys.stderr)
    return 2


def _plugins_failed() -> int | None:
    """Import the plugins first (runs may be of a plugin's architecture or optimizer, which labels ask
    for): for one that cannot be imported, its one line and status 2 instead of a traceback later."""
    from mars.errors import ConfigError
    from mars.plugins import load_plugins

    try:
        load_plugins()
    except ConfigError as e:
        return _fail(e)
    return None


def _direction_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--direction",
        choices=["lower", "higher"],
        help="whether lower or higher values of --metric are better (default: by its name, "
        "mars.analysis.metric: accuracies higher, losses and unknown keys lower)",
    )


def report_main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    from mars.analysis.report import (
        build_report,
        comparison_lines,
        comparison_table,
        header_lines,
        markdown_table,
        write_report,
    )
    from mars.entry import ArgumentParser

    p = ArgumentParser(
        prog="report.py",
        description=description or "Compare the settings of one or more sweeps, seeds pooled, to a baseline.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("sweep_dirs", nargs="+", type=Path, help="sweep dirs (multirun/DATE/TIME) or run dirs")
    p.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="the group to compare against, by a config key or override (repeat to narrow it down); "
        "default: the first group in sorted order",
    )
    p.add_argument(
        "--target",
        type=float,
        help="target value of --metric, e.g. a val loss (default: the baseline's mean final value)",
    )
    p.add_argument(
        "--metric",
        default="val/loss",
        metavar="KEY",
        help="the metrics.jsonl key compared, e.g. val/loss (default), train/loss, downstream/hellaswag/acc",
    )
    _direction_option(p)
    p.add_argument(
        "--unpaired",
        action="store_true",
        help="Welch's test and unpaired intervals even where a group ran the baseline's seeds",
    )
    p.add_argument(
        "--best",
        action="store_true",
        help="when --baseline matches several groups, take the one with the lowest mean final val loss "
        "(the tuned baseline, e.g. the best AdamW lr of a sweep; for --metric: the best mean final value)",
    )
    p.add_argument("--out", type=Path, help="where report.md/.json and the plots go (default: the first dir)")
    p.add_argument(
        "--edges",
        action="store_true",
        help="also check that each optimizer's best setting is bracketed by what was swept "
        "(mars.analysis.edges): a best value with no worse setting below or above it is named",
    )
    args = p.parse_args(argv)
    if (status := _plugins_failed()) is not None:
        return status
    out = args.out or args.sweep_dirs[0]
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        return _fail(UserError(f"--out {args.out} is a file: give a directory (created if missing)"))
    try:
        report = build_report(
            args.sweep_dirs,
            args.baseline,
            args.target,
            best=args.best,
            metric=args.metric,
            direction=args.direction,
            paired=not args.unpaired,
        )
        edges = _edge_lines(args.sweep_dirs, report.metric) if args.edges else []
        written = write_report(report, out, [("Edges of the swept ranges", edges)] if edges else [])
    except UserError as e:
        return _fail(e)
    except OSError as e:
        return _fail(UserError(f"cannot write the report into {out} ({e}); choose another --out"))
    print("\n".join(header_lines(report)))
    print()
    print(markdown_table(report))
    if len(report.groups) > 1:
        print()
        print("\n".join(comparison_lines(report)))
        print()
        print(comparison_table(report))
    if edges:
        print("\nEdges of the swept ranges:")
        print("\n".join(f"  {line}" for line in edges))
    for w in report.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print("\nwrote " + ", ".join(str(w) for w in written))
    return 0


def _edge_lines(roots: Sequence[Path], metric) -> list[str]:
    """report.py --edges: what was checked, then each edge found (or that none was)."""
    from mars.analysis.edges import sweep_edges
    from mars.analysis.runs import load_runs

    edges, checked = sweep_edges(load_runs(list(roots)), metric)
    found = [f"edge: {e.line()}" for e in edges]
    return checked + (found or ["every best setting is bracketed: a worse setting swept on each side of it"])


def summarize_main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    from mars.analysis.metric import metric_of
    from mars.analysis.summary import (
        COLUMNS,
        format_table,
        metric_columns,
        summarize,
        write_csv,
        write_heatmap,
    )
    from mars.entry import ArgumentParser

    p = ArgumentParser(prog="summarize_sweep.py", description=description)
    p.add_argument("multirun_dir", type=Path, help="a Hydra sweep dir (multirun/DATE/TIME)")
    p.add_argument("--csv", type=Path, help="CSV path (default MULTIRUN_DIR/summary.csv)")
    p.add_argument(
        "--heatmap", type=Path, help="heatmap path for 2-D sweeps (default MULTIRUN_DIR/summary_heatmap.png)"
    )
    p.add_argument(
        "--metric",
        default="best_val_loss",
        metavar="KEY",
        help="the heatmap's value: best_val_loss (default) or final_val_loss; or any logged key (e.g. "
        "downstream/hellaswag/acc), whose final and best values then get columns of their own, order the "
        "rows and fill the heatmap (its best value)",
    )
    _direction_option(p)
    args = p.parse_args(argv)
    if (status := _plugins_failed()) is not None:
        return status
    root = args.multirun_dir
    if not root.is_dir():
        return _fail(UserError(f"{root} is not a directory"))
    try:
        legacy = args.metric in COLUMNS[:2]
        metric = metric_of("val/loss" if legacy else args.metric, args.direction)
        swept, rows = summarize(root, metric)
    except UserError as e:
        return _fail(e)
    print(format_table(swept, rows, metric))
    csv_path = args.csv or root / "summary.csv"
    write_csv(csv_path, swept, rows, metric)
    print(f"\nwrote {csv_path}")
    if len(swept) == 2:
        png = args.heatmap or root / "summary_heatmap.png"
        column = args.metric if legacy else metric_columns(metric)[1]
        write_heatmap(png, swept, rows, column, higher_is_better=metric.higher_is_better and not legacy)
        print(f"wrote {png}")
    return 0


def plot_curves_main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    from mars.analysis.labels import disambiguate, read_run, run_labels
    from mars.analysis.metric import metric_of
    from mars.analysis.plots import DEFAULT_PANELS, plot_curves
    from mars.analysis.runs import METRICS, Run, find_run_dirs
    from mars.analysis.wandb_csv import read_wandb_csv
    from mars.entry import ArgumentParser

    p = ArgumentParser(prog="plot_curves.py", description=description)
    p.add_argument("inputs", nargs="+", type=Path, help="run dirs, sweep dirs and/or W&B CSV exports")
    p.add_argument(
        "--out", type=Path, default=Path("curves.png"), help="PNG path (a PDF is written next to it)"
    )
    p.add_argument(
        "--metric",
        action="append",
        metavar="KEY",
        help="a metrics.jsonl key to plot, one column of panels each (repeat for several); "
        "default: train/loss and val/loss",
    )
    _direction_option(p)
    p.add_argument("--labels", nargs="+", help="legend labels, one per curve, in input order")
    p.add_argument(
        "--zoom",
        nargs=4,
        type=float,
        metavar=("X0", "X1", "Y0", "Y1"),
        help="inset window on the loss-vs-tokens plots, in the plotted token unit",
    )
    p.add_argument("--logx", action="store_true")
    p.add_argument("--logy", action="store_true")
    p.add_argument(
        "--smooth",
        type=int,
        default=1,
        help="moving-average window for metrics logged on training lines, e.g. the train loss",
    )
    p.add_argument("--title")
    p.add_argument(
        "--tokens-per-step",
        type=float,
        default=480 * 1024,
        help="tokens per step for CSV exports without a tokens column (default: the paper's 480x1024)",
    )
    p.add_argument("--no-paper", action="store_true", help="leave out the paper's reference markers")
    p.add_argument(
        "--full-range",
        action="store_true",
        help="y axes over the whole range (default: from the values after the first tenth of training)",
    )
    args = p.parse_args(argv)
    if (status := _plugins_failed()) is not None:
        return status

    inputs: list[Path] = []
    for path in args.inputs:
        if path.is_dir() and not (path / METRICS).is_file():  # a sweep dir: its runs
            runs = [r for r in find_run_dirs(path) if (r / METRICS).is_file()]
            if not runs:
                return _fail(UserError(f"{path} holds no run dirs (no metrics.jsonl at or under it)"))
            inputs += runs
        elif path.is_dir() or (path.suffix == ".csv" and path.is_file()):
            inputs.append(path)
        else:
            return _fail(UserError(f"{path} is neither a run dir, a sweep dir nor a .csv file"))
    try:
        metrics = [metric_of(k, args.direction) for k in (args.metric or DEFAULT_PANELS)]
        dirs = [path for path in inputs if path.is_dir()]
        run_dirs = [read_run(path) for path in dirs]
        labels, common = run_labels(run_dirs) if run_dirs else ([], "")
        has_csv = len(dirs) < len(inputs)
        runs: list[Run] = []
        for path in inputs:
            if path.is_dir():
                run = run_dirs[dirs.index(path)]
                text = labels[dirs.index(path)]
                run.label = f"{common}, {text}" if has_csv and common and text else (text or common)
                runs.append(run)
            else:
                runs.extend(read_wandb_csv(path, args.tokens_per_step))
        for m in metrics if args.metric else ():  # the default panels may stay empty (no evaluation yet)
            if not any(m.key in r.metrics for r in runs):
                logged = sorted({k for r in runs for k in r.metrics})
                raise UserError(f"no input logged {m.key} (logged: {', '.join(logged) or 'nothing'})")
    except UserError as e:
        return _fail(e)
    disambiguate(run_dirs, dirs)
    legend_title = None if has_csv else common or None
    if args.labels:
        if len(args.labels) != len(runs):
            return _fail(UserError(f"{len(args.labels)} labels for {len(runs)} curves"))
        for r, text in zip(runs, args.labels, strict=True):
            r.label = text
        legend_title = None
    written = plot_curves(
        runs,
        args.out,
        metrics=metrics,
        zoom=args.zoom,
        logx=args.logx,
        logy=args.logy,
        smooth_window=args.smooth,
        title=args.title,
        paper_markers=not args.no_paper,
        legend_title=legend_title,
        full_range=args.full_range,
    )
    print("wrote " + ", ".join(str(w) for w in written))
    return 0
