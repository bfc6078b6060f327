"""Reading what train.py leaves in a run dir: the resolved config, the overrides and the metrics.

A run dir is any dir holding ``.hydra/config.yaml`` (a sweep job ``SWEEP/N/`` or a plain run
``outputs/DATE/TIME/``). ``metrics.jsonl`` holds one JSON object per line; values may be the
strings "nan"/"inf" (JSON has no non-finite floats) and the last line may be cut short by a kill,
so reading is tolerant of both.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mars.analysis.errors import AnalysisError

CONFIG = Path(".hydra") / "config.yaml"
OVERRIDES = Path(".hydra") / "overrides.yaml"
HYDRA = Path(".hydra") / "hydra.yaml"
METRICS = "metrics.jsonl"
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


def to_float(value: Any) -> float | None:
    """A metric value as a float ("nan"/"inf" strings included); None when it is not a number."""
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


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl, skipping a line cut short by a kill (or any other bad line)."""
    records = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


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
        raise AnalysisError(f"{path} is not valid YAML ({problem}): repair or remove that run dir") from None


def read_config(run_dir: Path) -> dict:
    """The run's resolved config: .hydra/config.yaml, else the newest checkpoint's config.yaml."""
    candidates = [run_dir / CONFIG, *sorted((run_dir / "ckpt").glob("step_*/config.yaml"))[::-1]]
    for path in candidates:
        if path.is_file():
            cfg = _load_yaml(path) or {}
            if not isinstance(cfg, dict):
                raise AnalysisError(f"{path} does not hold a config mapping: repair or remove that run dir")
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


@dataclass
class Run:
    """One run dir: its config, overrides and loss curves as (tokens, loss) points in logged order."""

    path: Path
    sweep: Path  # the Hydra sweep it belongs to (the dir holding multirun.yaml), else the dir given
    config: dict
    overrides: dict[str, str]
    choices: dict[str, str] = field(default_factory=dict)
    val: list[tuple[float, float]] = field(default_factory=list)
    train: list[tuple[float, float]] = field(default_factory=list)
    has_metrics: bool = False
    last_step: int = 0
    last_tokens: float = 0.0

    @property
    def flat(self) -> dict[str, Any]:
        return flatten(self.config)

    @property
    def final_val(self) -> float:
        return self.val[-1][1] if self.val else math.nan

    @property
    def final_val_tokens(self) -> float:
        return self.val[-1][0] if self.val else math.nan

    @property
    def best_val(self) -> float:
        finite = [v for _, v in self.val if math.isfinite(v)]
        return min(finite) if finite else math.nan


def load_run(path: Path, sweep: Path, with_metrics: bool = True) -> Run:
    """A run dir's config, overrides, config-group choices and (unless with_metrics=False) curves."""
    overrides_path = path / OVERRIDES
    overrides = parse_overrides(_load_yaml(overrides_path) or []) if overrides_path.is_file() else {}
    run = Run(
        path=path, sweep=sweep, config=read_config(path), overrides=overrides, choices=read_choices(path)
    )
    metrics = path / METRICS
    if not metrics.is_file() or not with_metrics:
        run.has_metrics = metrics.is_file()
        return run
    run.has_metrics = True
    for rec in read_metrics(metrics):
        tokens = to_float(rec.get("tokens"))
        step = to_float(rec.get("step"))
        if tokens is None:
            continue
        run.last_tokens = max(run.last_tokens, tokens)
        run.last_step = max(run.last_step, int(step or 0))
        for key, dest in (("val/loss", run.val), ("train/loss", run.train)):
            value = to_float(rec.get(key))
            if value is not None:
                dest.append((tokens, value))
    return run


def load_runs(roots: list[Path]) -> list[Run]:
    """Every run under the given dirs (each may itself be a run); one line of error when there is none."""
    runs: list[Run] = []
    seen: set[Path] = set()
    for root in roots:
        if not root.is_dir():
            raise AnalysisError(f"{root} is not a directory (give a sweep dir or a run dir)")
        dirs = find_run_dirs(root)
        if not dirs:
            raise AnalysisError(
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


def require_val_loss(runs: list[Run]) -> None:
    """Every run must have logged val/loss: name the ones that did not, and why."""
    bad = [
        f"{r.path} ({'no metrics.jsonl' if not r.has_metrics else 'no val/loss line'})"
        for r in runs
        if not r.val
    ]
    if bad:
        raise AnalysisError(
            f"{len(bad)} run(s) without validation loss: {', '.join(bad)}; "
            "let them finish an evaluation or move them out of the dirs given"
        )
