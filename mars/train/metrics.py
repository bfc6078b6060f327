"""Where training metrics go: RUN_DIR/metrics.jsonl, Weights & Biases, and a tqdm bar (rank 0 only).

metrics.jsonl holds one JSON object per line; every line has "step" and "tokens" (docs/training.md,
"What a run writes").
Training lines add "train/loss", "lr", "grad_norm", ...; evaluation lines add "val/loss". Its format
(reading, the JSON encoding of values) lives in mars.metrics_jsonl, shared with mars.analysis.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mars.files import write_atomic
from mars.metrics_jsonl import (
    METRICS_FILE,
    corrupt_line_message,
    encode_line,
    jsonable,
    metrics_lines,
    read_metrics,
)
from mars.wandb_mode import wandb_mode as wandb_mode  # one rule for training and evaluation

__all__ = [
    "METRICS_FILE",
    "Metrics",
    "MetricsFile",
    "Progress",
    "BUILTIN_METRICS",
    "TRAINER_FAMILIES",
    "TRAINER_KEYS",
    "WandbLogger",
    "check_metrics",
    "logged_metrics",
    "read_metrics",
    "register_builtin_metric",
    "register_metric",
    "wandb_mode",
]

log = logging.getLogger(__name__)

# Every key mars writes into metrics.jsonl itself, in one place. A researcher's metric can take none of
# them (register_metric), and Metrics.log refuses a line holding a key that is neither one of these nor
# a registered metric's, so the list cannot fall behind the code. Two kinds:
#   - the trainer's core record (mars.train.trainer): what its loop measures itself (loss, lr, the
#     gradient norm and clipping, timing and throughput, and MFU, which is computed from that
#     throughput) and the evaluation lines; these need the loop's own state, not (model, optimizer);
#   - the built-in metrics (BUILTIN_METRICS: gamma, the mars/ diagnostics), functions of (model,
#     optimizer) registered in mars.train.builtin_metrics through the same path as a researcher's
#     (register_builtin_metric) and logged on training lines before them.
TRAINER_KEYS = (
    "step",  # every line: the step and the tokens so far
    "tokens",
    "train/loss",  # training lines
    "lr",
    "grad_norm",
    "train/clip_rate",
    "train/nonfinite_steps",
    "time",
    "train_time",  # seconds in training steps so far (no evaluation, checkpoints, compilation; and val lines)
    "ms_per_step",
    "ms_forward_backward",  # the split of ms_per_step (mars.train.step_time)
    "ms_optimizer",
    "tokens_per_s",
    "gamma",  # a built-in metric: with a gamma schedule (MARS)
    "mfu",  # on a GPU, or with $MARS_PEAK_FLOPS
    "max_memory_gb",  # on a GPU: the peak of memory allocated by tensors so far (the allocator's count)
    "val/loss",  # evaluation lines (with "time")
    "val/loss_avg",  # the averaged weights' (train.average; mars.train.average)
    "hardware",  # on the first line with seconds of each run segment: what they are measured on (words)
)
# key families: in-loop downstream scores downstream/TASK/METRIC (the trainer's evaluation lines; those
# of the averaged weights downstream_avg/TASK/METRIC), the MARS diagnostics mars/KEY (a built-in metric,
# mars.optim)
TRAINER_FAMILIES = ("downstream/", "downstream_avg/", "mars/")
BUILTIN_METRICS = ("gamma", "mars")  # of TRAINER_KEYS / TRAINER_FAMILIES: registered metrics

# name -> fn(model, optimizer): mars's built-in metrics, then the metrics a researcher adds, both read on
# every training line in this order
_BUILTIN: dict[str, Callable[[Any, Any], Any]] = {}
_REGISTERED: dict[str, Callable[[Any, Any], Any]] = {}


def is_trainer_key(key: str) -> bool:
    """Whether the trainer writes `key` itself (TRAINER_KEYS, TRAINER_FAMILIES)."""
    return key in TRAINER_KEYS or key.startswith(TRAINER_FAMILIES)


def can_log(key: str) -> bool:
    """Whether some run can write `key` into metrics.jsonl: the trainer (TRAINER_KEYS, TRAINER_FAMILIES)
    or a registered metric (its name, or NAME/KEY for a metric that returns a dict)."""
    return is_trainer_key(key) or any(key == n or key.startswith(n + "/") for n in _REGISTERED)


def register_metric(name: str, fn: Callable[[Any, Any], Any]) -> None:
    """Log ``fn(model, optimizer)`` on every training line of metrics.jsonl (and wandb) as ``name``; a
    dict it returns is logged as ``name/KEY`` per entry. ``model`` is the bare model (no DDP / compile
    wrapper; FSDP2 parameters are DTensors), ``optimizer`` the run's optimizer, both after the step of
    the log line. It runs on every rank at log steps (so it may use collectives), and rank 0's values
    are written; each value is read to the host there, so keep it cheap. It also runs once before the
    first step, where the optimizer may hold no state yet, so that a value that is not a number stops
    the run before it trains (check_metrics). Report, plots and the sweep summary then take the key with
    --metric (its direction: mars.analysis.metric).

    A name is registered once: a key the trainer writes itself (TRAINER_KEYS: train/loss, lr, ...) or
    another function under a registered name is refused in one line (mars.plugins.ConfigError);
    the same function again (its module imported a second time) changes nothing."""
    from mars.errors import ConfigError
    from mars.plugins import qualified_name

    _check_name(name, fn)
    if name in TRAINER_KEYS or (name + "/").startswith(TRAINER_FAMILIES):
        module = getattr(fn, "__module__", None) or "?"
        raise ConfigError(
            f"register_metric({name!r}): mars.train.trainer writes {name!r} itself (its keys: "
            f"{', '.join(TRAINER_KEYS)}, {', '.join(f + '*' for f in TRAINER_FAMILIES)}), so "
            f"{qualified_name(fn)} from {module} would overwrite it in metrics.jsonl: name the metric "
            f"something else, e.g. {module.rsplit('.', 1)[-1] + '/' + name.replace('/', '_')!r}"
        )
    _register(_REGISTERED, name, fn)


def register_builtin_metric(name: str, fn: Callable[[Any, Any], Any]) -> None:
    """register_metric for mars's own metrics (mars.train.builtin_metrics): a name of BUILTIN_METRICS,
    whose keys are reserved for it (TRAINER_KEYS, TRAINER_FAMILIES). A function that returns an empty
    dict logs nothing on that line (gamma without a gamma schedule)."""
    _check_name(name, fn)
    if name not in BUILTIN_METRICS:
        raise ValueError(f"register_builtin_metric({name!r}): not one of BUILTIN_METRICS {BUILTIN_METRICS}")
    _register(_BUILTIN, name, fn)


def _check_name(name: str, fn: Callable[[Any, Any], Any]) -> None:
    if (
        not isinstance(name, str)
        or not name
        or name != name.strip()
        or name.startswith("/")
        or name.endswith("/")
    ):
        raise ValueError(f"register_metric: {name!r} is not a metrics.jsonl key (e.g. 'weights/norm')")
    if not callable(fn):
        raise TypeError(
            f"register_metric({name!r}, ...): expected a function fn(model, optimizer), got {fn!r}"
        )


def _register(table: dict[str, Callable[[Any, Any], Any]], name: str, fn: Callable[[Any, Any], Any]) -> None:
    from mars.plugins import refuse_takeover

    if name in table:
        refuse_takeover("metric", name, {"fn": table[name]}, {"fn": fn})
    table[name] = fn


def _number(value: Any) -> float | None:
    """A metric's value as a float: an int or float, or a one-element tensor / numpy scalar; None for
    anything else (text, None, a bool, a tensor of several elements)."""
    if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and len(shape) > 0:
        return f"a {type(value).__name__} of shape {tuple(shape)}"
    text = repr(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({type(value).__name__})"


def _read(
    name: str, fn: Callable[[Any, Any], Any], value: Any, out: dict[str, float], builtin: bool = False
) -> None:
    """Add a metric's value(s) to `out` as floats; ConfigError naming the metric for a value that is not
    a number, or a key the trainer (or another metric) writes; a built-in metric writes its own keys."""
    from mars.errors import ConfigError
    from mars.plugins import qualified_name

    items = value.items() if isinstance(value, dict) else [(None, value)]
    for key, v in items:
        full = name if key is None else f"{name}/{key}"
        number = _number(v)
        what = f"metric {full!r} (register_metric({name!r}, {qualified_name(fn)}))"
        if number is None:
            raise ConfigError(
                f"{what} returned {_describe(v)}: its function must return a number, a one-element "
                "tensor, or a dict of them (logged as NAME/KEY)"
            )
        if (is_trainer_key(full) and not builtin) or full in out:
            whose = "the trainer" if is_trainer_key(full) else "another registered metric"
            raise ConfigError(
                f"{what} writes {full!r}, which {whose} writes too: rename the metric or the key"
            )
        out[full] = number


def logged_metrics(model, optimizer) -> dict[str, float]:
    """The built-in and registered metrics' values now, as floats, in that order, each table in
    registration order (computed without autograd).
    ConfigError naming the metric when one fails or returns something that is not a number."""
    import torch

    from mars.errors import ConfigError
    from mars.plugins import qualified_name

    out: dict[str, float] = {}
    for builtin, table in ((True, _BUILTIN), (False, _REGISTERED)):
        for name, fn in table.items():
            try:
                with torch.no_grad():
                    value = fn(model, optimizer)
            except Exception as e:  # noqa: BLE001 - a plugin's failure is one line naming it
                reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
                raise ConfigError(
                    f"metric {name!r} (register_metric({name!r}, {qualified_name(fn)})) failed: {reason}"
                ) from e
            _read(name, fn, value, out, builtin)
    return out


def check_metrics(model, optimizer) -> None:
    """Before the first step: every registered metric once, its values checked as at a log line
    (ConfigError naming the metric). One that raises is left to the first log line: before the first
    step the optimizer may hold no state yet. The built-in metrics are mars's own, tested with it (and
    the diagnostics are read once per line: a read here would take that read)."""
    import torch

    out: dict[str, float] = {}
    for name, fn in _REGISTERED.items():
        try:
            with torch.no_grad():
                value = fn(model, optimizer)
        except Exception:  # noqa: BLE001, S112 - checked again, and reported, at the first log line
            continue
        _read(name, fn, value, out)


def _check_keys(record: dict) -> None:
    """Every key of a line is mars's own (TRAINER_KEYS) or a registered metric's: a key the trainer
    wrote without declaring it would escape register_metric's check."""
    for key in record:
        if not is_trainer_key(key) and not any(key == n or key.startswith(n + "/") for n in _REGISTERED):
            raise RuntimeError(
                f"metrics.jsonl key {key!r} is neither in mars.train.metrics.TRAINER_KEYS nor a registered "
                "metric's: add it to TRAINER_KEYS (or TRAINER_FAMILIES) with the code that logs it"
            )


class MetricsFile:
    """Append-only metrics.jsonl, flushed per line so a killed run keeps everything it logged."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / METRICS_FILE
        self._f = None

    def truncate_after(self, step: int) -> None:
        """On resume: drop lines logged after the checkpoint we continue from (they will be redone), and a
        last line torn by a kill. A damaged line among the kept ones stays as it is, with a warning (a
        resume never fails for it); one among the dropped ones goes with them, said as well."""
        if not self.path.exists():
            return
        lines = metrics_lines(self.path)
        later = [i for i, (_, _, r) in enumerate(lines) if r is not None and r.get("step", 0) > step]
        tail = min(later, default=len(lines))  # lines are in step order: from here on, all are redone
        kept = []
        for i, (number, text, record) in enumerate(lines):
            if record is None:
                where = (
                    "kept as it is; repair or delete it (the analysis tools refuse the file until then)"
                    if i < tail
                    else f"dropped with the lines after step {step}, which this run logs again"
                )
                log.warning(f"{corrupt_line_message(self.path, number, text)}: {where}")
            if i < tail if record is None else record.get("step", 0) <= step:
                kept.append(text + "\n")
        data = "".join(kept).encode("utf-8", errors="surrogateescape")
        write_atomic(self.path, data)  # a crash here keeps the old file

    def write(self, record: dict) -> None:
        if self._f is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f = open(self.path, "a")
        self._f.write(encode_line(record))
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class WandbLogger:
    """A thin wandb run; `run_id` is stored in checkpoints so a resumed job continues the same run."""

    def __init__(self, cfg, run_dir: str | os.PathLike, config: dict, run_id: str | None = None):
        self.mode = wandb_mode(cfg.mode)
        self.run = None
        self.run_id = run_id
        if self.mode == "disabled":
            return
        import wandb

        self.run = wandb.init(
            project=cfg.project,
            name=cfg.name or Path(run_dir).name,
            entity=cfg.entity,
            group=cfg.group,
            tags=list(cfg.tags) or None,
            config=config,
            dir=str(run_dir),
            mode=self.mode,
            id=run_id,
            resume="allow" if run_id else None,
        )
        self.run_id = self.run.id

    def log(self, record: dict) -> None:
        if self.run is not None:
            data = {k: jsonable(v) for k, v in record.items() if k != "step" and not isinstance(v, str)}
            for k, v in record.items():
                if isinstance(v, str):  # words (the hardware): the run's summary, not a curve
                    self.run.summary[k] = v
            self.run.log(data, step=int(record["step"]))

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


class Progress:
    """tqdm bar over optimizer steps showing loss, lr, tokens/s (and MFU on GPU); ETA from tqdm."""

    def __init__(self, total: int, initial: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, leave=True)

    def advance(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def show(self, record: dict) -> None:
        """Put a training record's loss, lr, tokens/s (and MFU) next to the bar."""
        if self.bar is None:
            return
        post = {"loss": f"{record['train/loss']:.4f}", "lr": f"{record['lr']:.2e}"}
        post["tok/s"] = f"{record['tokens_per_s']:.0f}"
        if record.get("mfu") is not None:
            post["mfu"] = f"{100 * record['mfu']:.1f}%"
        self.bar.set_postfix(post, refresh=True)

    def write(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg)
        else:
            log.info(msg)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Metrics:
    """Fan-out of one record to metrics.jsonl, wandb and the bar. Only the main rank constructs one."""

    def __init__(self, run_dir, wandb_cfg, config: dict, wandb_run_id: str | None = None):
        self.file = MetricsFile(run_dir)
        self.wandb = WandbLogger(wandb_cfg, run_dir, config, run_id=wandb_run_id)

    def log(self, record: dict) -> None:
        _check_keys(record)
        self.file.write(record)
        self.wandb.log(record)

    def close(self) -> None:
        self.file.close()
        self.wandb.finish()
