"""The training configs of a study, checked before any trial runs.

Each arm is composed as train.py composes a run (mars.train.cli.precheck: the strict schema, every
interpolation, every value check) with its search space at each corner that matters: every key at
its lower bound, every key at its upper bound, and each choice of a choice key. So a search key the
arm's optimizer does not take (the strict registry of mars.optim), a key no config has, or a bound the
key cannot take (a negative gamma, an lr_1d of 0) stops the study in one line naming the spec key,
before anything runs. `valid` asks the same of one value (auto_extend asks it before widening).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mars.study.errors import StudyError
from mars.study.spec import Arm, Study


@dataclass
class ArmConfig:
    """What the driver needs from an arm's composed config."""

    optimizer: str
    tokens_per_run: int  # train.max_steps x global batch x block size
    data: Any  # the data config (prepared once, before the trials)


_composed: dict[
    tuple[str, ...], Any
] = {}  # argv -> config or ConfigError: a spec is composed once per process


def _compose(study: Study, arm: Arm, values: dict[str, Any], extra: tuple[str, ...] = ()):
    """The config of `train.py BASE ARM VALUES EXTRA` (mars.train.cli.precheck), or its ConfigError (one
    line)."""
    from mars.entry import hydra_value
    from mars.train.cli import precheck
    from mars.train.config import ConfigError

    argv = (*study.base, *arm.overrides, *(f"{k}={hydra_value(v)}" for k, v in values.items()), *extra)
    if argv not in _composed:
        try:
            _composed[argv] = precheck(
                [*argv, f"hydra.run.dir={hydra_value(str(study.dir / 'search' / arm.name / '000'))}"]
            ).cfg
        except ConfigError as e:
            _composed[argv] = e
    if isinstance(_composed[argv], ConfigError):
        raise _composed[argv]
    return _composed[argv]


def _corners(arm: Arm) -> list[tuple[str, dict[str, Any]]]:
    lows = {k: d.lo if d.numeric else d.choices[0] for k, d in arm.space.items()}
    highs = {k: d.hi if d.numeric else lows[k] for k, d in arm.space.items()}
    corners = [("at the lower bounds", lows), ("at the upper bounds", highs)]
    for k, d in arm.space.items():
        for c in d.choices[1:]:
            corners.append((f"with {k}={c}", {**lows, k: c}))
    return corners


def check_arm(study: Study, arm: Arm) -> ArmConfig:
    """Compose and check the arm at the corners of its space; StudyError naming the spec key."""
    from mars.optim import optimizer_names, registered
    from mars.train.config import ConfigError, global_batch_size

    where = f"study.arms.{arm.name}"
    try:
        cfg = _compose(study, arm, {})
    except ConfigError as e:
        raise StudyError(f"{where}.overrides (with study.base): {e}") from None
    name = str(cfg.optimizer.name)
    keys = (
        [f.name for f in dataclasses.fields(registered(name).config)] if name in optimizer_names() else None
    )
    for key, dist in arm.space.items():
        field_name = key.split(".", 1)[1] if key.startswith("optimizer.") else None
        if keys is not None and field_name is not None and field_name not in keys:
            taken = ", ".join(k for k in keys if k != "name")
            raise StudyError(
                f"{dist.where}: optimizer={name} has no key '{field_name}' (mars.optim's registry); "
                f"its keys: {taken}"
            )
    for what, values in _corners(arm):
        try:
            _compose(study, arm, values)
        except ConfigError as e:
            keys_named = [k for k in values if k in str(e)] or list(values)
            at = arm.space[keys_named[0]].where
            raise StudyError(f"{at}: the arm does not compose {what} ({e})") from None
    _check_averaged_metric(study, where, cfg)
    tokens = int(cfg.train.max_steps) * global_batch_size(cfg, 1) * int(cfg.model.block_size)
    return ArmConfig(name, tokens, cfg.data)


def _check_averaged_metric(study: Study, where: str, cfg) -> None:
    """A metric of the averaged weights (val/loss_avg, downstream_avg/...) needs train.average in the arm:
    without it no trial would log the key (found before any trial trains, not after the first)."""
    key = str(study.spec["metric"]["key"])
    if (key == "val/loss_avg" or key.startswith("downstream_avg/")) and str(cfg.train.average) == "off":
        raise StudyError(
            f"study.metric.key={key} is the averaged weights' loss, but {where} trains with "
            "train.average=off: add train.average=ema (or tail, decay_sqrt) to study.base, or use "
            f"study.metric.key={key.replace('_avg', '')}"
        )


def check_sizes(study: Study, arm: Arm) -> list:
    """The arm's sizes (mars.study.budgets.Size: budgets in steps, fork points, parameters), each composed
    with its overrides and checked: StudyError naming the spec key. [] without budgets or sizes."""
    from mars.study.budgets import check_schedule, check_size_configs, size_of
    from mars.train.config import ConfigError

    spec = study.spec
    if not spec["budgets"] and not spec["sizes"]:
        return []
    sizes = spec["sizes"] or {"": []}
    cfgs = {}
    for name, overrides in sizes.items():
        where = f"study.sizes.{name}" if name else "study.budgets"
        try:
            cfgs[name] = _compose(study, arm, {}, tuple(overrides))
        except ConfigError as e:
            raise StudyError(f"{where} with study.arms.{arm.name}: {e}") from None
        if len(spec["budgets"]) > 1:
            check_schedule(cfgs[name], f"study.arms.{arm.name}{f' at size {name}' if name else ''}")
    check_size_configs(study, cfgs)
    return [size_of(name, sizes[name], cfg, spec) for name, cfg in cfgs.items()]


def valid(study: Study, arm: Arm, key: str, value: Any) -> str | None:
    """None when the arm composes with `key` at `value` (the other keys at their lower bounds), else the
    one-line reason."""
    from mars.train.config import ConfigError

    lows = dict(_corners(arm)[0][1])
    lows[key] = value
    try:
        _compose(study, arm, lows)
    except ConfigError as e:
        return str(e)
    return None


def prepare_data(configs: list[ArmConfig], write: bool = True) -> None:
    """Prepare each distinct dataset once, before trials start several at a time; write=False (a dry
    run): only check that each is prepared, or can be (mars.data.prepare.check_ready), writing nothing."""
    from omegaconf import OmegaConf

    from mars.data import ensure_prepared
    from mars.data.errors import DataError
    from mars.data.prepare import check_ready

    done: set[str] = set()
    for c in configs:
        text = OmegaConf.to_yaml(c.data)
        if text in done:
            continue
        done.add(text)
        try:
            (ensure_prepared if write else check_ready)(c.data)
        except DataError as e:
            raise StudyError(" ".join(str(e).split())) from None


def check_metric_key(key: str) -> None:
    """study.metric.key is a key some run logs (mars.train.metrics.can_log: the trainer's keys and the
    registered metrics'), found before any trial trains rather than after the first one has."""
    import difflib

    from mars.train.metrics import TRAINER_FAMILIES, TRAINER_KEYS, can_log

    if can_log(key):
        return
    keys = [k for k in TRAINER_KEYS if k not in ("step", "tokens", "time")]
    close = difflib.get_close_matches(key, keys, n=1)
    raise StudyError(
        f"study.metric.key={key!r} is a key no run logs"
        f"{f' (did you mean {close[0]}?)' if close else ''}: runs log {', '.join(keys)}, "
        f"{', '.join(f + 'KEY' for f in TRAINER_FAMILIES)} and the metrics plugins register"
    )


def study_dir_ok(path: Path) -> None:
    """The study dir is a directory, or one can be made there."""
    from mars.train.config import ConfigError
    from mars.train.rundir import check_output_dir_writable

    if path.exists() and not path.is_dir():
        raise StudyError(f"study.dir={path} is a file: choose a directory (created if missing)")
    try:
        check_output_dir_writable(str(path), "study.dir")
    except ConfigError as e:
        raise StudyError(str(e)) from None
