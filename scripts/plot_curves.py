"""Plot training and validation loss against tokens and against wall-clock time.

    python scripts/plot_curves.py RUN_DIR [RUN_DIR ...] --out curves.png
    python scripts/plot_curves.py outputs/a outputs/b wandb_export.csv --zoom 20 50 2.8 3.0 --out owt.png

Inputs: run dirs (their metrics.jsonl; the label comes from the run's config) and CSV files
exported from Weights & Biases (a run's history with "train/loss" / "val/loss" columns, or a
chart export with "RUN - val/loss" columns). When a run matches a paper preset (GPT-2
small / medium / large on OpenWebText with AdamW, Muon or MARS-AdamW), the paper's best
validation losses (MARS_SPEC section 6) are drawn as reference markers at 5B, 20B and 50B tokens.
Writes OUT (PNG) and the same figure as PDF next to it.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

# MARS_SPEC section 6: best validation loss on OpenWebText, by optimizer and model, at 5B / 20B / 50B tokens
PAPER_BEST_VAL = {
    ("AdamW", "small"): (3.193, 3.024, 2.885),
    ("AdamW", "medium"): (3.084, 2.821, 2.691),
    ("AdamW", "large"): (3.013, 2.741, 2.561),
    ("Muon", "small"): (3.165, 3.006, 2.901),
    ("Muon", "medium"): (3.009, 2.813, 2.688),
    ("Muon", "large"): (2.915, 2.691, 2.573),
    ("MARS-exact", "small"): (3.107, 2.980, 2.847),
    ("MARS-approx", "small"): (3.108, 2.981, 2.849),
    ("MARS-approx", "medium"): (2.969, 2.763, 2.636),
    ("MARS-approx", "large"): (2.876, 2.647, 2.518),
}
PAPER_TOKENS = (5e9, 20e9, 50e9)
SHAPES = {(12, 12, 768): "small", (24, 16, 1024): "medium", (36, 20, 1280): "large", (48, 25, 1600): "xl"}
OPT_NAMES = {
    "adamw": "AdamW", "lion": "Lion", "muon": "Muon", "moonlight": "Moonlight", "mars_adamw": "MARS-AdamW",
    "mars_lion": "MARS-Lion", "mars_shampoo": "MARS-Shampoo", "mars_m": "MARS-M",
}  # fmt: skip


@dataclass
class Curve:
    label: str
    train: list[tuple[float, float, float]] = field(default_factory=list)  # (tokens, seconds, loss)
    val: list[tuple[float, float, float]] = field(default_factory=list)
    paper_key: tuple[str, str] | None = None


# ----------------------------------------------------------------------------- reading runs


def run_config(run_dir: Path) -> dict:
    """The run's resolved config: .hydra/config.yaml, else the newest checkpoint's config.yaml."""
    candidates = [
        run_dir / ".hydra" / "config.yaml",
        *sorted((run_dir / "ckpt").glob("step_*/config.yaml"))[::-1],
    ]
    for path in candidates:
        if path.is_file():
            return yaml.safe_load(path.read_text()) or {}
    return {}


def describe(cfg: dict) -> tuple[str, tuple[str, str] | None]:
    """A legend label for a config, and its (optimizer, size) key in PAPER_BEST_VAL when it matches."""
    opt, model, data = cfg.get("optimizer", {}), cfg.get("model", {}), cfg.get("data", {})
    name = opt.get("name", "?")
    label = OPT_NAMES.get(name, name)
    if name.startswith("mars") and name != "mars_m":
        label += " (approx)" if opt.get("approx", True) else " (exact)"
    size = SHAPES.get((model.get("n_layer"), model.get("n_head"), model.get("n_embd")))
    parts = [label, f"GPT-2 {size}" if size else f"{model.get('n_layer', '?')}L/{model.get('n_embd', '?')}d"]
    if "lr" in opt:
        parts.append(f"lr {opt['lr']:g}")
    paper = None
    if data.get("name") == "openwebtext" and size:
        key = {"adamw": "AdamW", "muon": "Muon"}.get(name)
        if name == "mars_adamw":
            key = "MARS-approx" if opt.get("approx", True) else "MARS-exact"
        if (key, size) in PAPER_BEST_VAL:
            paper = (key, size)
    return ", ".join(parts), paper


def flatten(cfg: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


# keys that say where a run lives or how it is logged, not what it trains
_NOT_SETTINGS = ("data.root", "train.resume", "train.progress", "train.device", "logger.", "downstream.")
# keys already in describe()'s label
_IN_LABEL = (
    "optimizer.name",
    "optimizer.approx",
    "optimizer.lr",
    "model.n_layer",
    "model.n_head",
    "model.n_embd",
)


def distinguishing_settings(configs: list[dict]) -> list[dict[str, object]]:
    """Per config, the settings whose values differ between the configs (e.g. the keys of a sweep)."""
    flat = [flatten(c) for c in configs]
    keys = sorted({k for f in flat for k in f})
    differing = [
        k
        for k in keys
        if len({repr(f.get(k)) for f in flat}) > 1 and not k.startswith(_NOT_SETTINGS) and k not in _IN_LABEL
    ]
    return [{k: f.get(k) for k in differing} for f in flat]


def read_run(run_dir: Path, cfg: dict | None = None) -> Curve:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {path} not found (expected a run dir written by train.py)")
    label, paper = describe(run_config(run_dir) if cfg is None else cfg)
    curve = Curve(label=label, paper_key=paper)
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        tokens, seconds = float(rec.get("tokens", 0)), float(rec.get("time", math.nan))
        for key, dest in (("train/loss", curve.train), ("val/loss", curve.val)):
            v = rec.get(key)
            if isinstance(v, (int, float)) and math.isfinite(v):
                dest.append((tokens, seconds, float(v)))
    return curve


def read_wandb_csv(path: Path, tokens_per_step: float) -> list[Curve]:
    """Curves from a W&B CSV export: run history (one run) or chart export ("RUN - metric" columns)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return []
    cols = list(rows[0])
    step_col = next((c for c in ("step", "_step", "Step", "iter") if c in cols), None)

    def num(row, col):
        try:
            v = float(row.get(col, ""))
        except (TypeError, ValueError):
            return math.nan
        return v

    def point(row):
        tokens = num(row, "tokens")
        if not math.isfinite(tokens):
            tokens = num(row, step_col) * tokens_per_step if step_col else math.nan
        seconds = num(row, "time") if "time" in cols else num(row, "_runtime")
        return tokens, seconds

    curves: dict[str, Curve] = {}
    for row in rows:
        tokens, seconds = point(row)
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


# ----------------------------------------------------------------------------- drawing


def smooth(values: list[float], window: int) -> list[float]:
    if window <= 1:
        return values
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def token_unit(max_tokens: float) -> tuple[float, str]:
    if max_tokens >= 1e9:
        return 1e9, "B"
    if max_tokens >= 1e6:
        return 1e6, "M"
    if max_tokens >= 1e3:
        return 1e3, "K"
    return 1.0, ""


def time_unit(max_seconds: float) -> tuple[float, str]:
    if max_seconds >= 2 * 3600:
        return 3600.0, "hours"
    if max_seconds >= 120:
        return 60.0, "minutes"
    return 1.0, "seconds"


def plot(
    curves: list[Curve],
    out: Path,
    zoom=None,
    logx=False,
    logy=False,
    smooth_window=1,
    title=None,
    paper_markers=True,
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    all_points = [p for c in curves for p in (*c.train, *c.val)]
    tok_scale, tok_suffix = token_unit(max((p[0] for p in all_points), default=1.0))
    finite_t = [p[1] for p in all_points if math.isfinite(p[1])]
    t_scale, t_name = time_unit(max(finite_t, default=1.0))
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, c in enumerate(curves):
        color = colors[i % len(colors)]
        for col, (series, kind) in enumerate(((c.train, "train"), (c.val, "val"))):
            if not series:
                continue
            ys = [p[2] for p in series]
            if kind == "train":
                ys = smooth(ys, smooth_window)
            style = {"color": color, "label": c.label, "lw": 1.4}
            if kind == "val" and len(series) < 30:
                style.update(marker="o", ms=3)
            axes[0, col].plot([p[0] / tok_scale for p in series], ys, **style)
            timed = [(p[1] / t_scale, y) for p, y in zip(series, ys, strict=True) if math.isfinite(p[1])]
            if timed:
                axes[1, col].plot(*zip(*timed, strict=True), **style)
        if paper_markers and c.paper_key and c.val:
            reach = max(p[0] for p in c.val) * 1.05
            for tokens, best in zip(PAPER_TOKENS, PAPER_BEST_VAL[c.paper_key], strict=True):
                if tokens <= reach:
                    axes[0, 1].plot(
                        tokens / tok_scale,
                        best,
                        marker="*",
                        ms=12,
                        color=color,
                        mec="k",
                        ls="none",
                        label=f"paper {c.paper_key[0]} {c.paper_key[1]} (best val)",
                    )
    for row, xlabel in enumerate(
        (
            f"Training tokens ({tok_suffix})" if tok_suffix else "Training tokens",
            f"Wall-clock time ({t_name})",
        )
    ):
        for col, ylabel in enumerate(("Training loss", "Validation loss")):
            ax = axes[row, col]
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            if logx:
                ax.set_xscale("log")
            if logy:
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(FormatStrFormatter("%.2f"))
                ax.yaxis.set_minor_formatter(FormatStrFormatter("%.2f"))
                ax.tick_params(axis="y", which="minor", labelsize=7)
            if ax.lines:
                handles, labels = ax.get_legend_handles_labels()
                uniq = dict(zip(labels, handles, strict=True))
                ax.legend(uniq.values(), uniq.keys(), fontsize=8, loc="lower left" if zoom else "best")
    if zoom is not None:
        x0, x1, y0, y1 = zoom
        for col in range(2):
            ax = axes[0, col]
            if not ax.lines:
                continue
            inset = ax.inset_axes([0.52, 0.52, 0.45, 0.43])  # upper right: loss curves fall away from it
            for line in ax.lines:
                inset.plot(
                    line.get_xdata(),
                    line.get_ydata(),
                    color=line.get_color(),
                    lw=line.get_linewidth(),
                    marker=line.get_marker(),
                    ms=line.get_markersize(),
                    ls=line.get_linestyle(),
                )
            inset.set_xlim(x0, x1)
            inset.set_ylim(y0, y1)
            inset.grid(True, alpha=0.3)
            inset.tick_params(labelsize=7)
            ax.indicate_inset_zoom(inset, edgecolor="0.4")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    written = [out, out.with_suffix(".pdf")]
    for path in written:
        fig.savefig(path, dpi=150)
    plt.close(fig)
    return written


def disambiguate(curves: list[Curve], dirs: list[Path]) -> None:
    """Runs whose configs agree on everything a label shows would share one legend entry:
    add the run dir's name to each such label."""
    counts: dict[str, int] = {}
    for c in curves:
        counts[c.label] = counts.get(c.label, 0) + 1
    for c, path in zip(curves, dirs, strict=True):
        if counts[c.label] > 1:
            c.label += f" [{path.resolve().name}]"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", type=Path, help="run dirs and/or W&B CSV exports")
    p.add_argument(
        "--out", type=Path, default=Path("curves.png"), help="PNG path (a PDF is written next to it)"
    )
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
        "--smooth", type=int, default=1, help="moving-average window for the train loss (log lines)"
    )
    p.add_argument("--title")
    p.add_argument(
        "--tokens-per-step",
        type=float,
        default=480 * 1024,
        help="tokens per step for CSV exports without a tokens column (default: the paper's 480x1024)",
    )
    p.add_argument("--no-paper", action="store_true", help="leave out the paper's reference markers")
    args = p.parse_args(argv)

    configs = {path: run_config(path) for path in args.inputs if path.is_dir()}
    extras = dict(zip(configs, distinguishing_settings(list(configs.values())), strict=True))
    curves: list[Curve] = []
    for path in args.inputs:
        if path.is_dir():
            curve = read_run(path, configs[path])
            if extras[path]:
                curve.label += ", " + ", ".join(f"{k.split('.')[-1]}={v}" for k, v in extras[path].items())
            curves.append(curve)
        elif path.suffix == ".csv" and path.is_file():
            curves.extend(read_wandb_csv(path, args.tokens_per_step))
        else:
            print(f"error: {path} is neither a run dir nor a .csv file", file=sys.stderr)
            return 2
    dirs = [path for path in args.inputs if path.is_dir()]
    if len(dirs) == len(curves):
        disambiguate(curves, dirs)
    if args.labels:
        if len(args.labels) != len(curves):
            print(f"error: {len(args.labels)} labels for {len(curves)} curves", file=sys.stderr)
            return 2
        for c, label in zip(curves, args.labels, strict=True):
            c.label = label
    written = plot(
        curves,
        args.out,
        zoom=args.zoom,
        logx=args.logx,
        logy=args.logy,
        smooth_window=args.smooth,
        title=args.title,
        paper_markers=not args.no_paper,
    )
    print("wrote " + ", ".join(str(w) for w in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
