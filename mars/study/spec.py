"""The study spec, and every check a study passes before anything runs.

The spec (configs/study/NAME.yaml, chosen with `study=NAME`): its schema and value checks; then the
arms' training configs, composed and checked at the corners of their spaces; then the study dir, its
storage and its run dirs (preflight), and what the study will spend.

    python scripts/study.py study=micro [study.KEY=VALUE ...] [TRAINING OVERRIDES ...]

The spec is composed with Hydra's compose API against the dataclass schema below (registered as
schema/study, which each configs/study/*.yaml extends), so a misspelt key or a wrong type is refused
when it is composed. Command-line arguments that are not study=/study.* are training overrides,
added to the spec's `base` (e.g. `model=llama_tiny` runs the study on LLaMA). `check_spec` then
refuses every value that cannot work, one line each, naming the key and the fix:

    name          the study's name (W&B group; the storage's study names start with it)
    dir           the study dir (default studies/NAME): the trials' run dirs, the storage, the report
    storage       an optuna storage URL (default sqlite:///DIR/study.db); an RDB URL (postgresql://...)
                  lets several drivers, on machines that share the study dir, run one study
    base          training overrides every trial gets: model, data, the budget (train.max_steps) ...
    arms          NAME: {overrides: training overrides of this arm (optimizer=..., experiment=...),
                  search: its search space (mars.study.search), trials: its budget (default: trials)}
    baseline      the arm the others are compared with (default: the first)
    trials        search trials per arm (equal for every arm unless an arm sets its own)
    search_seed   train.seed of every search trial
    sampler       name: sobol (scrambled Sobol quasi-random, as AlgoPerf), random or tpe; seed;
                  startup_trials (tpe: random trials before it models; default optuna's)
    metric        key (any metrics.jsonl key; val/loss), direction (lower / higher; default by the key's
                  name, mars.analysis.metric), summary (final or best value of the run)
    edges         tolerance: the edge rule (mars.analysis.edges): the best trial must be bracketed, on
                  each side of each numeric key, by a trial worse than it by more than this
    auto_extend   rounds (0: off), trials: an arm whose best sits at a bound gets `trials` more, in the
                  range widened there (mars.study.search), up to `rounds` times
    final         top_k, seeds: the top_k configs of each arm rerun with these seeds, shared by all arms
    budgets       [B1, B2, ...] increasing: the finals at every budget, each finalist and seed ONE wsd trunk
                  of the largest and a cooldown branch per smaller budget (mars.study.scale); [] (the
                  default): the finals at the base's train.max_steps
    budget_unit   steps (train.max_steps) or tokens (a whole number of train.global_batch_size x
                  model.block_size)
    sizes         NAME: [model overrides]: the finals (and budgets) per model size, shape overrides only;
                  the search runs at the first; {} (the default): the base's model
    tune          trials: {SIZE: N}: a search at each size named, N trials per arm (mars.study.scale);
                  finals (own / first: each size's optimum or the first size's), holdout (the size
                  the report predicts and checks), budgets (true: search at every budget too)
    launcher      name (local / submitit), n_jobs (trials at a time), gpus_per_job (local: GPUs of
                  its own per trial, as launch.gpus_per_job), command (what runs a trial; default
                  python -m mars.train), submitit (the executor's parameters: cluster, timeout_min,
                  slurm_partition, gpus_per_node, ...)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING

from mars.errors import UserError
from mars.study.search import Dist, parse_space
from mars.study.storage import shown

SAMPLERS = ("sobol", "random", "tpe")
SUMMARIES = ("final", "best")
LAUNCHERS = ("local", "submitit")
# training keys the study sets itself: a spec that sets them is refused
RESERVED = ("train.seed", "train.data_seed", "train.resume", "train.overwrite")
# spec keys that may change between runs of one study (how it runs, not what it finds)
OPERATIONAL = ("dir", "storage", "launcher")


@dataclass
class ArmSpec:
    overrides: list[str] = field(default_factory=list)
    search: dict[str, Any] = field(default_factory=dict)
    trials: int | None = None


@dataclass
class SamplerSpec:
    name: str = "sobol"
    seed: int = 0
    startup_trials: int | None = None


@dataclass
class MetricSpec:
    key: str = "val/loss"
    direction: str | None = None
    summary: str = "final"


@dataclass
class EdgeSpec:
    tolerance: float = 0.0


@dataclass
class ExtendSpec:
    rounds: int = 0
    trials: int = 4


@dataclass
class FinalSpec:
    top_k: int = 1
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])


@dataclass
class LauncherSpec:
    name: str = "local"
    n_jobs: int = 1
    gpus_per_job: int = 0
    command: list[str] | None = None
    submitit: dict[str, Any] = field(default_factory=dict)


@dataclass
class TuneSpec:
    trials: dict[str, int] = field(default_factory=dict)
    finals: str = "own"
    holdout: str | None = None
    budgets: bool = False


@dataclass
class StudySpec:
    name: str = MISSING
    dir: str | None = None
    storage: str | None = None
    base: list[str] = field(default_factory=list)
    arms: dict[str, ArmSpec] = field(default_factory=dict)
    baseline: str | None = None
    trials: int = 12
    search_seed: int = 0
    sampler: SamplerSpec = field(default_factory=SamplerSpec)
    metric: MetricSpec = field(default_factory=MetricSpec)
    edges: EdgeSpec = field(default_factory=EdgeSpec)
    auto_extend: ExtendSpec = field(default_factory=ExtendSpec)
    final: FinalSpec = field(default_factory=FinalSpec)
    launcher: LauncherSpec = field(default_factory=LauncherSpec)
    budgets: list[int] = field(default_factory=list)
    budget_unit: str = "steps"
    sizes: dict[str, list[str]] = field(default_factory=dict)
    tune: TuneSpec = field(default_factory=TuneSpec)


PRIMARY = "mars_study"
MAPPINGS = ("study.arms", "study.sizes", "study.launcher.submitit")  # spec keys that hold a mapping


def register() -> None:
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(group="schema", name="study", node=StudySpec)
    store.store(name=PRIMARY, node={"defaults": [{"study": MISSING}, "_self_"]})


def is_study_override(arg: str) -> bool:
    key = arg.lstrip("+~").split("=", 1)[0]
    return key == "study" or key.startswith("study.")


def compose_spec(args: list[str]) -> dict:
    """The spec `study=NAME study.KEY=VALUE ...` composes to (a plain dict), the other arguments added to
    its base; UserError with Hydra's message as one line."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from mars.entry import is_composition_error, one_line
    from mars.train.config import config_dir, register_configs

    study_args = [a for a in args if is_study_override(a)]
    training = [a for a in args if not is_study_override(a)]
    for arg in study_args:
        key, _, value = arg.partition("=")
        if value.strip() == "{}" and key.lstrip("+") in MAPPINGS:
            raise UserError(
                f"{arg} empties nothing: Hydra merges a mapping into the spec's {key.lstrip('+')}, so {{}} "
                f"changes nothing; drop an entry with ~{key.lstrip('+')}.NAME, or write a spec of your own "
                "(configs/study/NAME.yaml)"
            )
    if not any(a.split("=", 1)[0] == "study" for a in study_args):
        names = sorted(p.stem for p in Path(config_dir(), "study").glob("*.yaml"))
        raise UserError(
            f"choose a study spec: study=NAME (configs/study/ holds {', '.join(names) or 'none'})"
        )
    register_configs()
    register()
    try:
        with initialize_config_dir(config_dir=config_dir(), version_base="1.3", job_name="study"):
            cfg = compose(config_name=PRIMARY, overrides=study_args)
        spec = OmegaConf.to_container(cfg.study, resolve=True, throw_on_missing=True)
    except Exception as e:
        if is_composition_error(e):
            raise UserError(needs_quotes(study_args) or _with_keys(one_line(e), e)) from None
        raise
    spec["base"] = [*spec["base"], *training]
    return spec


def needs_quotes(args: list[str]) -> str | None:
    """The first argument whose value Hydra's grammar cannot take unquoted (an '=' it reads as another
    key=value, a comma it reads as a sweep, a space or a non-ASCII letter), with the quoted form that
    works; else None. Hydra's own error names neither the argument nor the fix."""

    def awkward(text: str, commas: bool) -> bool:
        return any(c in text for c in "= " + ("," if commas else "")) or not text.isascii()

    for arg in args:
        key, _, value = arg.partition("=")
        v = value.strip()
        if not v or v[:1] in "'\"{":
            continue
        if v.startswith("[") and v.endswith("]"):
            items = [x.strip() for x in v[1:-1].split(",") if x.strip()]
            if not any(awkward(x, False) and x[:1] not in "'\"" for x in items):
                continue
            v = "[" + ",".join(x if x[:1] in "'\"" else f'"{x}"' for x in items) + "]"
        elif awkward(v, True):
            v = f'"{v}"'
        else:
            continue
        if key.lstrip("+") == "study.storage":  # no password in a message
            from mars.study.storage import shown

            arg, v = f"{key}={shown(value)}", f'"{shown(v[1:-1])}"'
        return (
            f"{arg}: Hydra's grammar cannot read this value unquoted (an '=', a comma, a space or a "
            f"non-ASCII letter in it); quote it: '{key}={v}' (in single quotes for the shell)"
        )
    return None


def _with_keys(message: str, e: BaseException) -> str:
    """A key the spec's schema has not: add the keys that node does have."""
    import dataclasses

    from mars.entry import unknown_key

    err = unknown_key(e)
    schemas = (
        StudySpec,
        ArmSpec,
        SamplerSpec,
        MetricSpec,
        EdgeSpec,
        ExtendSpec,
        FinalSpec,
        LauncherSpec,
        TuneSpec,
    )
    if err is None or err.object_type not in schemas:
        return message
    return f"{message}; its keys: {', '.join(f.name for f in dataclasses.fields(err.object_type))}"


# ----------------------------------------------------------------------------- the checked spec


@dataclass(frozen=True)
class Arm:
    name: str
    overrides: tuple[str, ...]
    space: dict[str, Dist]
    trials: int


@dataclass
class Study:
    """The spec, checked: what the driver runs."""

    spec: dict  # the composed spec (plain data), as saved in STUDY_DIR/spec.yaml
    name: str
    dir: Path
    storage: str
    base: tuple[str, ...]
    arms: list[Arm]
    baseline: str

    def arm(self, name: str) -> Arm:
        return next(a for a in self.arms if a.name == name)

    @property
    def seeds(self) -> list[int]:
        return list(self.spec["final"]["seeds"])


def _key(arg: str) -> str:
    return arg.lstrip("+~").split("=", 1)[0]


def _check_overrides(overrides: list[str], where: str) -> None:
    for arg in overrides:
        if not isinstance(arg, str) or "=" not in arg:
            raise UserError(f"{where}: {arg!r} is not a training override KEY=VALUE (or GROUP=OPTION)")
        key = _key(arg)
        if key in RESERVED:
            raise UserError(
                f"{where} sets {key}, which the study chooses itself (study.search_seed for the search, "
                "study.final.seeds for the finals; resume is automatic): drop it"
            )
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):
            raise UserError(
                f"{where} sets {key}: each trial's run dir is chosen by the study (study.dir); drop it"
            )


def _at_least(where: str, value: Any, minimum: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < minimum:
        raise UserError(f"{where}={value!r} must be a number >= {minimum}")


def check_spec(spec: dict) -> Study:
    """Every spec value that cannot work, as one UserError; else the Study the driver runs."""
    name = spec["name"]
    if not name or any(c in str(name) for c in "/\\:") or str(name) != str(name).strip():
        raise UserError(f"study.name={name!r} must be a plain name (no / \\ : or spaces around it)")
    _check_overrides(spec["base"], "study.base (or the command line)")
    arms_spec = spec["arms"]
    if not arms_spec:
        raise UserError(
            "study.arms is empty: give at least one arm in the spec (configs/study/NAME.yaml), e.g. "
            "arms: {adamw: {overrides: [optimizer=adamw]}}"
        )
    _at_least("study.trials", spec["trials"], 1)
    arms = []
    for arm_name, arm in arms_spec.items():
        where = f"study.arms.{arm_name}"
        if any(c in str(arm_name) for c in "/\\:") or not str(arm_name).strip():
            raise UserError(f"{where}: an arm's name must be a plain name (it names dirs)")
        _check_overrides(arm["overrides"], f"{where}.overrides")
        space = parse_space(arm["search"], f"{where}.search") if arm["search"] else {}
        for arg in [*spec["base"], *arm["overrides"]]:
            if _key(arg) in space:
                raise UserError(
                    f"{where}.search searches {_key(arg)}, which {arg!r} also fixes: drop one of them"
                )
        trials = spec["trials"] if arm["trials"] is None else arm["trials"]
        if not space:  # nothing to search: the arm's fixed config goes straight to the finals
            trials = 0
        _at_least(f"{where}.trials", trials, 0 if not space else 1)
        arms.append(Arm(str(arm_name), tuple(arm["overrides"]), space, int(trials)))
    baseline = spec["baseline"] if spec["baseline"] is not None else arms[0].name
    if baseline not in arms_spec:
        raise UserError(f"study.baseline={baseline!r} is not an arm ({', '.join(arms_spec)})")
    sampler = spec["sampler"]
    if sampler["name"] not in SAMPLERS:
        raise UserError(f"study.sampler.name={sampler['name']!r} is not one of {', '.join(SAMPLERS)}")
    if sampler["startup_trials"] is not None:
        _at_least("study.sampler.startup_trials", sampler["startup_trials"], 0)
    metric = spec["metric"]
    if not metric["key"] or str(metric["key"]).strip() != metric["key"]:
        raise UserError(f"study.metric.key={metric['key']!r} is not a metrics.jsonl key (e.g. val/loss)")
    if metric["direction"] not in (None, "lower", "higher"):
        raise UserError(
            f"study.metric.direction={metric['direction']!r} is not lower, higher or null (by name)"
        )
    if metric["summary"] not in SUMMARIES:
        raise UserError(f"study.metric.summary={metric['summary']!r} is not one of {', '.join(SUMMARIES)}")
    _at_least("study.edges.tolerance", spec["edges"]["tolerance"], 0)
    _at_least("study.auto_extend.rounds", spec["auto_extend"]["rounds"], 0)
    _at_least("study.auto_extend.trials", spec["auto_extend"]["trials"], 1)
    final = spec["final"]
    _at_least("study.final.top_k", final["top_k"], 1)
    short = next((a for a in arms if a.space and a.trials < final["top_k"]), None)
    if short is not None:
        raise UserError(
            f"study.final.top_k={final['top_k']} is more than the {short.trials} search trials of arm "
            f"{short.name}: the finals rerun at most that many configs; lower study.final.top_k or raise "
            "study.trials"
        )
    seeds = final["seeds"]
    if not seeds or len(set(seeds)) < len(seeds):
        raise UserError(
            f"study.final.seeds={seeds} must be a non-empty list of distinct seeds (e.g. [1, 2, 3])"
        )
    from mars.study.scale import check_budget_spec

    check_budget_spec(spec)
    from mars.study.scale import check_tune_spec

    check_tune_spec(spec)
    launcher = spec["launcher"]
    if launcher["name"] not in LAUNCHERS:
        raise UserError(f"study.launcher.name={launcher['name']!r} is not one of {', '.join(LAUNCHERS)}")
    _at_least("study.launcher.n_jobs", launcher["n_jobs"], 1)
    _at_least("study.launcher.gpus_per_job", launcher["gpus_per_job"], 0)
    _check_command(launcher)
    directory = Path(spec["dir"] or Path("studies") / str(name)).expanduser().absolute()
    from mars.study.storage import default_storage

    storage = spec["storage"] or default_storage(directory)
    return Study(spec, str(name), directory, storage, tuple(spec["base"]), arms, str(baseline))


def public_spec(spec: dict) -> dict:
    """The spec as it is written down (spec.yaml, the storage, study.json): its storage URL's password
    masked."""
    from mars.study.storage import shown

    return {**spec, "storage": shown(spec["storage"])} if spec.get("storage") else spec


def _check_command(launcher: dict) -> None:
    """study.launcher.command: with the local launcher, a program this machine has. The command line
    reads an unquoted false, true or null as a value, which arrives here as the word False, True or
    None: the refusal then says to quote it."""
    import shutil

    command = launcher["command"]
    if command is None:
        return
    if not command:
        raise UserError("study.launcher.command is empty: give the command that runs a trial, or null")
    program = str(command[0])
    if launcher["name"] != "local" or shutil.which(program) is not None:
        return
    if program in ("False", "True", "None"):
        word = {"None": "null"}.get(program, program.lower())
        raise UserError(
            f"study.launcher.command=[{word}, ...]: the command line read {word} as a value ({program}), not "
            f"a program: quote it, e.g. 'study.launcher.command=[\"{word}\"]'"
        )
    raise UserError(
        f"study.launcher.command: {program!r} is not a program on PATH, nor a path to one: give the command "
        "that runs a trial (default: python -m mars.train)"
    )


def identity(spec: dict) -> dict:
    """The part of a spec that decides what the study finds (everything but OPERATIONAL keys; `tune` at
    its default counts as absent, as in the specs written before it existed)."""
    out = {k: v for k, v in spec.items() if k not in OPERATIONAL}
    if out.get("tune") == {"trials": {}, "finals": "own", "holdout": None, "budgets": False}:
        del out["tune"]
    return out


# --------------------------------------------------------------------------------------------------
# The training configs of a study, checked before any trial runs.
#
# Each arm is composed as train.py composes a run (mars.train.cli.precheck: the strict schema, every
# interpolation, every value check) with its search space at each corner that matters: every key at
# its lower bound, every key at its upper bound, and each choice of a choice key. So a search key the
# arm's optimizer does not take (the strict registry of mars.optim), a key no config has, or a bound the
# key cannot take (a negative gamma, an lr_1d of 0) stops the study in one line naming the spec key,
# before anything runs. `valid` asks the same of one value (auto_extend asks it before widening).


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
    from mars.errors import ConfigError
    from mars.train.cli import precheck

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
    """Compose and check the arm at the corners of its space; UserError naming the spec key."""
    from mars.errors import ConfigError
    from mars.optim import optimizer_names, registered
    from mars.train.config import global_batch_size

    where = f"study.arms.{arm.name}"
    try:
        cfg = _compose(study, arm, {})
    except ConfigError as e:
        raise UserError(f"{where}.overrides (with study.base): {e}") from None
    name = str(cfg.optimizer.name)
    keys = (
        [f.name for f in dataclasses.fields(registered(name).config)] if name in optimizer_names() else None
    )
    for key, dist in arm.space.items():
        field_name = key.split(".", 1)[1] if key.startswith("optimizer.") else None
        if keys is not None and field_name is not None and field_name not in keys:
            taken = ", ".join(k for k in keys if k != "name")
            raise UserError(
                f"{dist.where}: optimizer={name} has no key '{field_name}' (mars.optim's registry); "
                f"its keys: {taken}"
            )
    for what, values in _corners(arm):
        try:
            _compose(study, arm, values)
        except ConfigError as e:
            keys_named = [k for k in values if k in str(e)] or list(values)
            at = arm.space[keys_named[0]].where
            raise UserError(f"{at}: the arm does not compose {what} ({e})") from None
    _check_averaged_metric(study, where, cfg)
    tokens = int(cfg.train.max_steps) * global_batch_size(cfg, 1) * int(cfg.model.block_size)
    return ArmConfig(name, tokens, cfg.data)


def _check_averaged_metric(study: Study, where: str, cfg) -> None:
    """A metric of the averaged weights (val/loss_avg, downstream_avg/...) needs train.average in the arm:
    without it no trial would log the key (found before any trial trains, not after the first)."""
    key = str(study.spec["metric"]["key"])
    if (key == "val/loss_avg" or key.startswith("downstream_avg/")) and str(cfg.train.average) == "off":
        raise UserError(
            f"study.metric.key={key} is the averaged weights' loss, but {where} trains with "
            "train.average=off: add train.average=ema (or tail, decay_sqrt) to study.base, or use "
            f"study.metric.key={key.replace('_avg', '')}"
        )


def check_sizes(study: Study, arm: Arm) -> list:
    """The arm's sizes (mars.study.scale.Size: budgets in steps, fork points, parameters), each composed
    with its overrides and checked: UserError naming the spec key. [] without budgets or sizes."""
    from mars.errors import ConfigError
    from mars.study.scale import check_schedule, size_of

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
            raise UserError(f"{where} with study.arms.{arm.name}: {e}") from None
        if len(spec["budgets"]) > 1:
            check_schedule(cfgs[name], f"study.arms.{arm.name}{f' at size {name}' if name else ''}")
    check_size_configs(study, cfgs)
    return [size_of(name, sizes[name], cfg, spec) for name, cfg in cfgs.items()]


def valid(study: Study, arm: Arm, key: str, value: Any) -> str | None:
    """None when the arm composes with `key` at `value` (the other keys at their lower bounds), else the
    one-line reason."""
    from mars.errors import ConfigError

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
    from mars.data.prepare import check_ready
    from mars.errors import DataError

    done: set[str] = set()
    for c in configs:
        text = OmegaConf.to_yaml(c.data)
        if text in done:
            continue
        done.add(text)
        try:
            (ensure_prepared if write else check_ready)(c.data)
        except DataError as e:
            raise UserError(" ".join(str(e).split())) from None


def check_metric_key(key: str) -> None:
    """study.metric.key is a key some run logs (mars.train.metrics.can_log: the trainer's keys and the
    registered metrics'), found before any trial trains rather than after the first one has."""
    import difflib

    from mars.train.metrics import TRAINER_FAMILIES, TRAINER_KEYS, can_log

    if can_log(key):
        return
    keys = [k for k in TRAINER_KEYS if k not in ("step", "tokens", "time")]
    close = difflib.get_close_matches(key, keys, n=1)
    raise UserError(
        f"study.metric.key={key!r} is a key no run logs"
        f"{f' (did you mean {close[0]}?)' if close else ''}: runs log {', '.join(keys)}, "
        f"{', '.join(f + 'KEY' for f in TRAINER_FAMILIES)} and the metrics plugins register"
    )


def study_dir_ok(path: Path) -> None:
    """The study dir is a directory, or one can be made there."""
    from mars.errors import ConfigError
    from mars.train.rundir import check_output_dir_writable

    if path.exists() and not path.is_dir():
        raise UserError(f"study.dir={path} is a file: choose a directory (created if missing)")
    try:
        check_output_dir_writable(str(path), "study.dir")
    except ConfigError as e:
        raise UserError(str(e)) from None


# --------------------------------------------------------------------------------------------------
# The checks a study passes before anything runs, besides the spec's values and the arms' configs
# (mars.study.spec, mars.study.spec): is the study dir, and its storage, this spec's, and does every
# run dir under it belong to a trial the storage records? And what the study will spend.


SPEC_FILE = "spec.yaml"


def check_spec_file(study: Study) -> None:
    """STUDY_DIR/spec.yaml, if there is one, was written by this spec (operational keys aside)."""
    path = study.dir / SPEC_FILE
    if not path.is_file():
        return
    try:
        old = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"{path} cannot be read ({e}); restore it, or choose another study.dir") from None
    diff = differences(identity(old), identity(study.spec))
    if diff:
        raise UserError(
            f"{study.dir} holds a study of another spec ({path}): {'; '.join(diff)}; rerun it with "
            "that spec, or choose another study.dir"
        )


def check_storage_spec(study: Study, storage) -> None:
    """The storage's study of this name, if there is one, was made by this spec (a shared RDB)."""
    import optuna

    if study.name not in optuna.get_all_study_names(storage):
        return
    recorded = optuna.load_study(study_name=study.name, storage=storage).user_attrs.get("spec")
    if recorded is None:
        return
    diff = differences(identity(recorded), identity(study.spec))
    if diff:
        where = f"study.storage={shown(study.storage)} holds study {study.name!r}"
        raise UserError(
            f"{where} of another spec: {'; '.join(diff)}; rerun it with that spec, or give this one "
            "another study.name or study.storage"
        )


def check_dirs(study: Study, read_trials) -> None:
    """Run dirs under the study dir that the storage does not know, and known finished trials whose
    run dirs are gone: the study would lose or mix them (`read_trials()`: the storage's TrialRecords, read
    after the dirs were listed, so that a trial another driver starts meanwhile is known)."""
    from mars.train.rundir import holds_a_run

    runs = [
        d
        for pattern in ("search/*/*", "search/*/*/*", "final/*/*")  # search/ARM/SCOPE/NNN: study.tune
        for d in sorted(study.dir.glob(pattern))
        if d.is_dir() and holds_a_run(d)
    ]
    known = {t.dir.resolve(): t for t in read_trials() if t.dir is not None}
    unknown = [d for d in runs if d.resolve() not in known]
    if unknown:
        raise UserError(
            f"{unknown[0]} holds a run that study.storage={shown(study.storage)} does not record (was the "
            "storage replaced?): restore that storage, or move the run away (or choose another study.dir)"
        )
    for path, t in known.items():
        if t.state == "COMPLETE" and not Path(path).is_dir():
            raise UserError(
                f"the storage records {t.arm} {t.phase} trial {t.index} as finished, but its run dir "
                f"{path} is gone: restore it, or start again in another study.dir"
            )


def finalists(study: Study, arm) -> int:
    """The configs of an arm its finals rerun: top_k of its search, or its one fixed config."""
    return int(study.spec["final"]["top_k"]) if arm.space else 1


def budget_lines(study: Study, configs: dict, finals: bool = True) -> list[str]:
    """What the study will run, per arm and in all: runs and training tokens (`configs`: ArmConfigs);
    finals=False: the search's alone (with budgets and sizes, mars.study.scale counts the finals)."""
    s = study
    lines = []
    total_runs, total_tokens = 0, 0
    extend = s.spec["auto_extend"]
    for arm in s.arms:
        c = configs[arm.name]
        runs = arm.trials + (finalists(s, arm) * len(s.seeds) if finals else 0)
        total_runs += runs
        total_tokens += runs * c.tokens_per_run
        space = ", ".join(d.describe() for d in arm.space.values()) or "nothing searched"
        lines.append(
            f"{arm.name}{' (baseline)' if arm.name == s.baseline else ''}: optimizer={c.optimizer}, "
            f"{arm.trials} search trials over {space}; finals: top {finalists(s, arm)} x seeds "
            f"{s.seeds}; {runs} {'runs' if finals else 'search runs'} x {c.tokens_per_run:,} tokens = "
            f"{runs * c.tokens_per_run:,} tokens"
        )
    more = (
        f" (+ up to {extend['rounds']} round(s) of {extend['trials']} trials per arm at an edge)"
        if extend["rounds"]
        else ""
    )
    what = "runs" if finals else "search runs"
    lines.append(f"budget: {total_runs} {what}, {total_tokens:,} training tokens{more}")
    return lines


# --------------------------------------------------------------------------------------------------
# Where two nested configs differ, key by key, with both values: a study dir's spec against the
# command's (mars.study.spec) and the composed configs of a ladder's sizes (mars.study.scale).


def check_size_configs(study, cfgs: dict[str, Any]) -> None:
    """The composed config of each size (of one arm): everything but the model equal, one family."""
    from omegaconf import OmegaConf

    names = list(cfgs)
    first = cfgs[names[0]]
    ref = {k: v for k, v in OmegaConf.to_container(first, resolve=True).items() if k != "model"}
    for name in names[1:]:
        cfg = cfgs[name]
        if str(cfg.model.arch) != str(first.model.arch):
            raise UserError(
                f"study.sizes.{name} is model.arch={cfg.model.arch}, study.sizes.{names[0]} "
                f"{first.model.arch}: a ladder of sizes keeps one family (give shape overrides only)"
            )
        other = {k: v for k, v in OmegaConf.to_container(cfg, resolve=True).items() if k != "model"}
        if other != ref:
            diff = differences(ref, other, "")
            raise UserError(
                f"study.sizes.{name} changes more than the model's shape ({'; '.join(diff)[:200]}): a size "
                "may only change model keys"
            )


def differences(old: dict, new: dict, prefix: str = "study") -> list[str]:
    """Dotted keys where two specs differ, with both values."""
    out = []
    for k in sorted(set(old) | set(new), key=str):
        a, b = old.get(k, "<absent>"), new.get(k, "<absent>")
        where = f"{prefix}.{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, where)
        elif (
            isinstance(a, list) and isinstance(b, list) and all(isinstance(x, str) for x in a + b) and a != b
        ):
            gone, added = [x for x in a if x not in b], [x for x in b if x not in a]
            change = [*(f"-{x}" for x in gone), *(f"+{x}" for x in added)]
            out.append(f"{where}: {' '.join(change) or 'the same items in another order'} now")
        elif not _same(a, b):
            out.append(f"{where}: {a!r} then, {b!r} now")
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
        except (TypeError, ValueError):
            return False
    return a == b
