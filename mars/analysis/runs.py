"""The run table: what train.py leaves in a run dir (resolved config, overrides, every logged metric).

A run dir is any dir holding ``.hydra/config.yaml`` (a sweep job ``SWEEP/N/`` or a plain run
``outputs/DATE/TIME/``). Its ``metrics.jsonl`` is read by mars.metrics_jsonl, the format's one
reader (shared with the trainer): "nan"/"inf" strings become floats, a last line cut short by a kill
is skipped, and a damaged line anywhere else refuses the run dir in one line naming the file and line
(a run compared without some of its lines would be compared on numbers nobody chose).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from mars.errors import UserError
from mars.metrics_jsonl import METRICS_FILE as METRICS
from mars.metrics_jsonl import CorruptLineError, read_metrics, to_float

CONFIG = Path(".hydra") / "config.yaml"
OVERRIDES = Path(".hydra") / "overrides.yaml"
HYDRA = Path(".hydra") / "hydra.yaml"
MULTIRUN = "multirun.yaml"  # Hydra writes it into the sweep dir, next to the job dirs


def natural_key(path: Path) -> tuple:
    """Sort job dirs 0, 1, 2, ..., 10 rather than 0, 1, 10, 2."""
    parts = re.split(r"(\d+)", str(path))
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts)


def find_run_dirs(root: Path) -> list[Path]:
    """Every run dir at or under root, in natural order."""
    found = {p.parent.parent for p in root.glob(f"**/{CONFIG.as_posix()}")}
    if (root / CONFIG).is_file():
        found.add(root)
    return sorted(found, key=natural_key)


def flatten(cfg: dict, prefix: str = "") -> dict[str, Any]:
    """{"optimizer": {"lr": 1}} -> {"optimizer.lr": 1}; lists stay values."""
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def parse_overrides(items: list) -> dict[str, str]:
    """Hydra override strings ("optimizer.lr=0.003", "+x=1", "optimizer=adamw") as {key: value}.

    hydra.* overrides (where the sweep was written, the launcher) say nothing about the training.
    """
    out: dict[str, str] = {}
    for item in items or []:
        key, _, value = str(item).partition("=")
        key = key.lstrip("+~")
        if key and not key.startswith(("hydra.", "hydra/")) and key != "hydra":
            out[key] = value
    return out


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        problem = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{path} is not valid YAML ({problem}): repair or remove that run dir") from None


def read_config(run_dir: Path) -> dict:
    """The run's resolved config: .hydra/config.yaml, else the newest checkpoint's config.yaml."""
    candidates = [run_dir / CONFIG, *sorted((run_dir / "ckpt").glob("step_*/config.yaml"))[::-1]]
    for path in candidates:
        if path.is_file():
            cfg = _load_yaml(path) or {}
            if not isinstance(cfg, dict):
                raise UserError(f"{path} does not hold a config mapping: repair or remove that run dir")
            return cfg
    return {}


def read_choices(run_dir: Path) -> dict[str, str]:
    """Hydra's config-group choices of a run (model=gpt2_tiny, optimizer=adamw, ...), if recorded."""
    path = run_dir / HYDRA
    if not path.is_file():
        return {}
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError:
        return {}  # only used for labels; the resolved config is what counts
    choices = (doc.get("hydra") or {}).get("runtime", {}).get("choices", {}) or {}
    return {str(k): str(v) for k, v in choices.items() if not str(k).startswith("hydra") and v is not None}


class Point(NamedTuple):
    """One logged value of one metric: the line's step, tokens and time (nan when not logged)."""

    step: float
    tokens: float
    seconds: float
    value: float  # may be nan / inf: a diverged evaluation stays visible


@dataclass(eq=False)
class Run:
    """The run table: every metric a run logged (steps x keys), with the run's config and overrides.

    Built from a run dir (load_run) or from a W&B CSV export (mars.analysis.wandb_csv); report,
    plots and the sweep summary all read runs through it. `metrics` maps each logged key to its
    points in logged order; "step", "tokens" and "time" are the columns every point carries.
    """

    path: Path | None = None
    sweep: Path | None = (
        None  # the Hydra sweep it belongs to (the dir holding multirun.yaml), else the dir given
    )
    config: dict = field(default_factory=dict)
    overrides: dict[str, str] = field(default_factory=dict)
    choices: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, list[Point]] = field(default_factory=dict)
    label: str = ""  # how a plot names it (set by plot_curves)
    has_metrics: bool = False
    last_step: int = 0
    last_tokens: float = 0.0
    lineage: dict | None = None  # RUN_DIR/lineage.json: the run forked from or began with another's weights
    hardware: list[str] = field(default_factory=list)  # what its seconds were measured on, per segment

    def lineage_line(self) -> str | None:
        """ "RUN: fork of PARENT_RUN_DIR at step N" (or "weights of SOURCE"), with what the parent's hash
        says if it was replaced or changed since; None for a run of its own."""
        info = self.lineage
        if not info:
            return None
        if info.get("kind") == "fork":
            line = f"{self.path}: fork of {info.get('parent_run_dir')} at step {info.get('step')}"
        else:
            line = f"{self.path}: initial weights of {info.get('parent_checkpoint')}"
        note = self.parent.note if self.parent is not None else ""
        return f"{line} ({note})" if note else line

    @cached_property
    def parent(self):
        """Where the run's parent is now (mars.checkpoint.lineage.locate_parent); None if it has none."""
        from mars.checkpoint.lineage import locate_parent

        return locate_parent(self.lineage) if self.lineage else None

    def parent_points(self, key: str) -> list[tuple[float, float, float]]:
        """A fork's parent's (tokens, seconds, value) of a metric up to the step it forked at (its own
        metrics.jsonl holds only the steps after it), read where the parent's checksum hash finds it; []
        for other runs, or a parent that is gone, replaced or changed."""
        info = self.lineage or {}
        parent = self.parent.run_dir if self.parent is not None else None
        if info.get("kind") != "fork" or parent is None or not (parent / METRICS).is_file():
            return []
        try:
            run = load_run(parent)
        except UserError:
            return []
        step = float(info["step"])
        return [(p.tokens, p.seconds, p.value) for p in run.metrics.get(key, ()) if p.step <= step]

    @cached_property
    def flat(self) -> dict[str, Any]:
        return flatten(self.config)

    @property
    def keys(self) -> list[str]:
        return sorted(self.metrics)

    def curve(self, key: str) -> list[tuple[float, float]]:
        """(tokens, value) of a metric in logged order, non-finite values included."""
        return [(p.tokens, p.value) for p in self.metrics.get(key, ())]

    def points(self, key: str) -> list[tuple[float, float, float]]:
        """(tokens, seconds, value) of a metric's finite values, in logged order."""
        return [(p.tokens, p.seconds, p.value) for p in self.metrics.get(key, ()) if math.isfinite(p.value)]

    def final(self, key: str) -> float:
        """The last logged value of a metric (nan when it was never logged, or diverged)."""
        series = self.metrics.get(key)
        return series[-1].value if series else math.nan

    def final_tokens(self, key: str) -> float:
        series = self.metrics.get(key)
        return series[-1].tokens if series else math.nan

    @property
    def train(self) -> list[tuple[float, float, float]]:
        return self.points("train/loss")

    @property
    def val(self) -> list[tuple[float, float, float]]:
        return self.points("val/loss")

    @property
    def paper_key(self) -> tuple[str, str] | None:
        """The paper's reference entry this run reproduces (mars.analysis.paper), if any."""
        from mars.analysis.paper import paper_entry

        return paper_entry(self.config) if self.config else None

    def add(self, key: str, point: Point) -> None:
        self.metrics.setdefault(key, []).append(point)


AXES = ("step", "tokens", "time")  # the columns of every line, not metrics


def load_run(path: Path, sweep: Path | None = None, with_metrics: bool = True) -> Run:
    """A run dir's config, overrides, config-group choices and (unless with_metrics=False) metrics."""
    overrides_path = path / OVERRIDES
    overrides = parse_overrides(_load_yaml(overrides_path) or []) if overrides_path.is_file() else {}
    run = Run(
        path=path,
        sweep=path.parent if sweep is None else sweep,
        config=read_config(path),
        overrides=overrides,
        choices=read_choices(path),
    )
    from mars.checkpoint.lineage import LINEAGE_FILE, read_lineage

    run.lineage = read_lineage(path)
    step = (run.lineage or {}).get("step", 0)
    if not isinstance(step, int) or isinstance(step, bool):
        raise UserError(
            f'{path / LINEAGE_FILE}: "step" is {step!r}, not a step number (the file was edited or damaged): '
            "repair it (the parent's step the run began after) or delete it (the run then shows no parent)"
        )
    metrics = path / METRICS
    run.has_metrics = metrics.is_file()
    if not run.has_metrics or not with_metrics:
        return run
    try:
        records = read_metrics(metrics)
    except CorruptLineError as e:
        raise UserError(str(e)) from None
    for rec in records:
        tokens = to_float(rec.get("tokens"))
        if tokens is None:
            continue
        if isinstance(rec.get("hardware"), str) and rec["hardware"] not in run.hardware:
            run.hardware.append(rec["hardware"])
        step = to_float(rec.get("step"))
        seconds = to_float(rec.get("time"))
        step = math.nan if step is None else step
        seconds = math.nan if seconds is None else seconds
        run.last_tokens = max(run.last_tokens, tokens)
        if math.isfinite(step):
            run.last_step = max(run.last_step, int(step))
        for key, raw in rec.items():
            value = to_float(raw)
            if value is not None and key not in AXES:
                run.add(key, Point(step, tokens, seconds, value))
    return run


def load_runs(roots: list[Path]) -> list[Run]:
    """Every run under the given dirs (each may itself be a run); one line of error when there is none."""
    runs: list[Run] = []
    seen: set[Path] = set()
    for root in roots:
        if not root.is_dir():
            raise UserError(f"{root} is not a directory (give a sweep dir or a run dir)")
        dirs = find_run_dirs(root)
        if not dirs:
            raise UserError(
                f"no run dirs under {root} (a run dir holds .hydra/config.yaml, as train.py writes it)"
            )
        for path in dirs:
            resolved = path.resolve()
            if resolved in seen:
                continue
            seen.add(resolved)
            sweep = path.parent if (path.parent / MULTIRUN).is_file() else root
            runs.append(load_run(path, sweep))
    return runs


def require_metric(runs: list[Run], key: str = "val/loss") -> None:
    """Every run must have logged the metric: name the ones that did not, and why."""
    if runs and all(r.has_metrics for r in runs) and not any(key in r.metrics for r in runs):
        logged = sorted({k for r in runs for k in r.metrics})
        raise UserError(
            f"no run logged {key} (logged: {', '.join(logged) or 'nothing'}): choose one with --metric KEY"
        )
    bad = [
        f"{r.path} ({'no metrics.jsonl' if not r.has_metrics else f'no {key} line'})"
        for r in runs
        if key not in r.metrics
    ]
    if bad:
        what = "validation loss" if key == "val/loss" else key
        raise UserError(
            f"{len(bad)} run(s) without {what}: {', '.join(bad)}; "
            "let them finish an evaluation or move them out of the dirs given"
        )
