"""The training config: one dataclass per node, registered with Hydra as the schema of configs/config.yaml.

Because configs/config.yaml starts from this schema, a misspelt key or a value of the wrong type
fails when Hydra composes the config, before any data is read or a process group is created.
`validate` adds the checks a type system cannot express (positive sizes, divisibility, ...).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from mars.checks import above, at_least, at_most, choice, fraction, get, reported_as
from mars.data.config import DataConfig
from mars.errors import ConfigError
from mars.train.schedule import SCHEDULES
from mars.wandb_mode import WANDB_MODES

GRAD_REDUCTIONS = ("mean", "sum")
DTYPES = ("auto", "float32", "bfloat16")
PARALLEL_MODES = ("ddp", "fsdp")


@dataclass
class ScheduleConfig:
    """Learning-rate schedule: linear warmup, then `name` down to `min_lr` (absolute) at decay_steps."""

    name: str = "cosine"  # cosine | linear | wsd | constant
    warmup_steps: int = 100
    min_lr: float = 3e-5  # absolute; lr_1d keeps its ratio to lr all the way down
    decay_steps: int | None = None  # where the decay ends (None: train.max_steps)
    decay_fraction: float = 0.2  # wsd: the last fraction of decay_steps is the (linear) decay


@dataclass
class TrainConfig:
    max_steps: int = 1000
    batch_size: int = 8  # per-device micro-batch, in sequences
    global_batch_size: int | None = None  # sequences per optimizer step (None: batch_size x world size)
    eval_interval: int = 100  # steps between validation runs (0: only at the start and the end)
    eval_steps: int = 20  # validation micro-batches of batch_size sequences, summed over all ranks
    # averaged weights, evaluated next to the model's (val/loss_avg; mars.train.average): off | ema | tail |
    # decay_sqrt (Levanter's: a running mean, then weights 1 - sqrt of the progress through the decay)
    average: str = "off"
    average_decay: float = 0.999  # ema: avg <- avg + (1 - decay) (w - avg) every step; decay_sqrt: its weight
    # tail: the mean of the weights after every step past this one; decay_sqrt: where its decay begins.
    # A step (>= 1) or a fraction of train.max_steps (< 1); null: where the lr schedule's decay begins
    average_start: float | None = None
    log_interval: int = 10
    ckpt_interval: int = 1000  # 0: only the final (and preemption) checkpoint
    ckpt_steps: list[int] = field(default_factory=list)  # further steps to checkpoint at (e.g. the decay
    # starts of shorter budgets: mars.train.schedule.decay_start); each in 1..max_steps
    keep_last: int = 2  # checkpoints kept in RUN_DIR/ckpt (older ones are deleted)
    seed: int = 1337  # model init and every other random choice (dropout, ...)
    data_seed: int | None = None  # the order of the training batches (None: train.seed)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (bfloat16 autocast on CUDA, float32 on CPU) | float32 | bfloat16
    compile: bool | None = None  # None: on for CUDA, off for CPU
    grad_clip: float = 1.0  # global grad-norm clip (0: off; the norm is logged either way)
    grad_reduction: str = "mean"  # mean: loss / accumulation steps | sum: the reference (no division)
    resume: str | None = None  # auto (latest checkpoint of the run dir, else start fresh) | PATH
    overwrite: bool = False  # a new run in a run dir that holds one: move the old run aside (else refuse)
    # a new run from another run's checkpoint (a step dir, or a run dir: its newest): everything carried
    # over as a resume carries it (weights, optimizer, data position, RNG, step), in this run dir
    fork_from: str | None = None
    init_from: str | None = None  # weights alone (a run dir, a step dir, a Hugging Face GPT-2/LLaMA dir)
    max_nonfinite_steps: int = 5  # stop after this many skipped (non-finite) steps in a row
    # divergence alarms (mars/train/health.py): a checkpoint within health_window steps after an alarm
    # is marked unhealthy, and rotation keeps the newest healthy one
    spike_factor: float = 10.0  # grad norm above this x the recent median is a spike; a lone one is no
    # alarm, 3 steps in a row are (0: off)
    spike_loss: float = 1.0  # logged train loss this many nats above its best raises an alarm (0: off)
    health_window: int = 20
    backend: str | None = None  # process-group backend (None: nccl on CUDA, gloo on CPU)
    # how long a rank waits in a collective before the run fails: the other ranks wait this long while
    # rank 0 alone scores in-loop downstream tasks or writes a DDP checkpoint
    dist_timeout_min: float = 30.0
    parallel: str = "ddp"  # ddp (replicated model) | fsdp (FSDP2: model, grads, optimizer state sharded)
    fsdp_replicate: int = 1  # fsdp: replicas of the sharded model (2-D HSDP mesh; 1: plain FSDP)
    progress: bool = True  # tqdm bar on rank 0
    cpu_threads: int | None = None  # torch CPU threads per process (None: torch's default)


@dataclass
class WandbConfig:
    mode: str = "online"  # online (falls back to offline without WANDB_API_KEY) | offline | disabled
    project: str = "mars"
    name: str | None = None  # None: derived from the run dir
    entity: str | None = None
    group: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class LoggerConfig:
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass
class DownstreamConfig:
    """In-loop zero-shot evaluation through mars.eval (interval 0: off)."""

    tasks: list[str] = field(default_factory=list)
    interval: int = 0
    limit: int | None = None
    batch_size: int = 8
    num_fewshot: int = 0


@dataclass
class LaunchConfig:
    """How each job of a sweep (-m) runs on this machine; with hydra/launcher=parallel,
    hydra.launcher.n_jobs jobs run at once (mars/train/launch.py)."""

    gpus_per_job: int = 0  # 0: in the launcher's worker process; N: on N GPUs of its own (torchrun if N > 1)


@dataclass
class Config:
    model: Any = MISSING  # the chosen architecture's config dataclass (mars.model.spec, model.arch)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: Any = MISSING  # the chosen optimizer's own config dataclass (mars.optim registry)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    downstream: DownstreamConfig = field(default_factory=DownstreamConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)


SCHEMA_GROUP = "schema/optimizer"
MODEL_SCHEMA_GROUP = "schema/model"


def config_dir() -> str:
    """The repository's configs/ (absolute, so `python train.py` and `mars-train` both find it), or
    $MARS_CONFIG_DIR."""
    env = os.environ.get("MARS_CONFIG_DIR")
    if env:
        return str(Path(env).resolve())
    return str(Path(__file__).resolve().parents[2] / "configs")


def register_configs() -> None:
    """Load the plugins (mars.plugins), then store the schema as `base_config` (the first entry of
    configs/config.yaml's defaults), each registered optimizer's config dataclass as schema/optimizer/NAME,
    which configs/optimizer/NAME.yaml extends, and each architecture's as schema/model/ARCH, which
    configs/model/*.yaml extend: a key that optimizer or architecture does not take then fails when the
    config is composed. An optimizer or architecture with no YAML file (one a plugin registered) is also
    stored as the option optimizer=NAME / model=ARCH, with its config dataclass's defaults, and a data
    source with none as data=NAME (the data defaults with data.name=NAME). Storing is skipped when the
    same nodes are stored already (a quarter of a composition's time; every command composes more
    than once)."""
    from mars.data.registry import store_config_options
    from mars.model.spec import arch, arch_names
    from mars.optim import optimizer_names, registered
    from mars.plugins import load_plugins

    load_plugins()
    configs = Path(config_dir())
    presets = "\n".join(f.read_text(encoding="utf-8") for f in sorted(configs.glob("model/*.yaml")))
    nodes = [(None, "base_config", "", Config)]  # (group, name, the group a schema's errors name, node)
    for name in optimizer_names():
        nodes.append((SCHEMA_GROUP, name, "optimizer", registered(name).config))
        if not (configs / "optimizer" / f"{name}.yaml").is_file():
            nodes.append(("optimizer", name, "optimizer", registered(name).config))
    for name in arch_names():
        nodes.append((MODEL_SCHEMA_GROUP, name, "model", arch(name).config))
        if f"{MODEL_SCHEMA_GROUP}/{name}@" not in presets:
            nodes.append(("model", name, "model", arch(name).config))
    store = ConfigStore.instance()
    if _STORED != [store, nodes]:  # (Hydra's launchers may hand a process another ConfigStore)
        for group, name, errors_as, node in nodes:
            store.store(
                group=group, name=name, node=node if group is None else _schema(errors_as, name, node)
            )
        _STORED[:] = [store, nodes]
    store_config_options(configs)


_STORED: list = []  # the ConfigStore register_configs last stored into, and the nodes


def _schema(group: str, name: str, config: type) -> type:
    """A registered config dataclass, checked to be one a Hydra config can hold (a plugin's field may
    have any type): ConfigError naming the field and the fix otherwise."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from mars.errors import ConfigError

    try:
        OmegaConf.structured(config)
    except OmegaConfBaseException as e:
        key = f"{group}.{e.full_key}" if getattr(e, "full_key", None) else group
        problem = str(getattr(e, "msg", None) or e).splitlines()[0]
        raise ConfigError(
            f"{group}={name}: {key} of {config.__module__}.{config.__qualname__} cannot be a config field "
            f"({problem}): give it a type a Hydra config holds (int, float, bool, str, an Enum, a dataclass, "
            "a list or dict of those, or Optional of one) and convert it where the value is used"
        ) from None
    return config


# keys whose value must be a number at least this large, and keys with a fixed set of values
_MINIMUMS = {
    "train.max_steps": 1,
    "train.log_interval": 1,
    "train.eval_interval": 0,
    "train.eval_steps": 0,
    "train.ckpt_interval": 0,
    "train.keep_last": 1,
    "train.max_nonfinite_steps": 1,
    "train.spike_factor": 0.0,
    "train.spike_loss": 0.0,
    "train.health_window": 1,
    "train.grad_clip": 0.0,
    "model.block_size": 1,
    "schedule.warmup_steps": 0,
    "schedule.min_lr": 0.0,
    "downstream.interval": 0,
    "launch.gpus_per_job": 0,
}
# the longest train.dist_timeout_min: a year (torch.distributed counts a timeout in a 64-bit integer of
# small units, which inf or a few centuries overflow on every rank)
MAX_DIST_TIMEOUT_MIN = 525_600
_LONGEST_WAIT = " (minutes, at most a year)"
_CHOICES = {
    "schedule.name": SCHEDULES,
    "train.grad_reduction": GRAD_REDUCTIONS,
    "train.dtype": DTYPES,
    "logger.wandb.mode": WANDB_MODES,
}


def global_batch_size(cfg: Any, world_size: int) -> int:
    gbs = get(cfg, "train.global_batch_size")
    return int(gbs) if gbs is not None else int(get(cfg, "train.batch_size")) * world_size


_VALIDATED: set[tuple[str, int]] = set()  # (content, world size) of each config that passed in this process


def validate(cfg: Any, world_size: int = 1) -> None:
    """Raise ConfigError on the first value that cannot work. Cheap: reads no files. A composed config
    passes once per process: the run's own call after the command's precheck (mars.train.cli) is free."""
    # str(cfg): its values, interpolations unresolved (0.2 ms; to_yaml took 7)
    seen = (str(cfg), world_size) if OmegaConf.is_config(cfg) else None
    if seen in _VALIDATED:
        return
    with reported_as(ConfigError):
        _validate(cfg, world_size)
    if seen is not None:
        _VALIDATED.add(seen)


def _validate(cfg: Any, world_size: int) -> None:
    at_least("train.batch_size", get(cfg, "train.batch_size"), 1, " (sequences per device per micro-step)")
    for key, minimum in _MINIMUMS.items():
        at_least(key, get(cfg, key), minimum)
    above("train.dist_timeout_min", get(cfg, "train.dist_timeout_min"), 0, " (minutes)")
    at_most("train.dist_timeout_min", get(cfg, "train.dist_timeout_min"), MAX_DIST_TIMEOUT_MIN, _LONGEST_WAIT)
    if get(cfg, "train.cpu_threads") is not None:
        at_least("train.cpu_threads", get(cfg, "train.cpu_threads"), 1)
    for key, allowed in _CHOICES.items():
        choice(key, get(cfg, key), allowed)

    micro = int(get(cfg, "train.batch_size"))
    gbs = global_batch_size(cfg, world_size)
    if gbs < 1 or gbs % (micro * world_size) != 0:
        raise ConfigError(
            f"train.global_batch_size={gbs} is not a multiple of train.batch_size x world size = "
            f"{micro} x {world_size} = {micro * world_size}; pick a batch_size that divides "
            f"{gbs // world_size if gbs % world_size == 0 else gbs} per device"
        )
    lr = float(get(cfg, "optimizer.lr"))
    above("optimizer.lr", lr)
    if float(get(cfg, "schedule.min_lr")) > lr:
        raise ConfigError(
            f"schedule.min_lr={get(cfg, 'schedule.min_lr')} is above optimizer.lr={lr}; "
            "min_lr is an absolute learning rate"
        )
    decay = get(cfg, "schedule.decay_steps")
    warmup, max_steps = int(get(cfg, "schedule.warmup_steps")), int(get(cfg, "train.max_steps"))
    if decay is not None and decay <= warmup:
        raise ConfigError(f"schedule.decay_steps={decay} must be larger than schedule.warmup_steps={warmup}")
    if warmup > max_steps:
        raise ConfigError(
            f"schedule.warmup_steps={warmup} is longer than the run (train.max_steps={max_steps}): the "
            f"learning rate would never reach optimizer.lr; lower schedule.warmup_steps to at most "
            f"{max_steps} (e.g. {max(0, max_steps // 10)}), or raise train.max_steps"
        )
    fraction("schedule.decay_fraction", float(get(cfg, "schedule.decay_fraction")), closed=True)
    _check_ckpt_steps(get(cfg, "train.ckpt_steps"), max_steps)
    _check_average(cfg)
    _check_start(cfg)
    _check_model(cfg)
    _check_data(cfg)
    _check_tokenizer(cfg)
    _check_optimizer(cfg)
    check_device(str(get(cfg, "train.device")))
    _check_compile(cfg)
    _check_parallel(cfg, world_size)
    if get(cfg, "downstream.interval") > 0 and not get(cfg, "downstream.tasks"):
        raise ConfigError(
            "downstream.interval > 0 needs downstream.tasks (e.g. downstream.tasks=[hellaswag])"
        )


def _check_ckpt_steps(steps: Any, max_steps: int) -> None:
    bad = [
        s for s in (steps or []) if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= max_steps
    ]
    if bad:
        raise ConfigError(
            f"train.ckpt_steps={list(steps)}: {bad[0]!r} is not a step of this run; give whole steps from 1 "
            f"to train.max_steps={max_steps} (e.g. train.ckpt_steps=[{max(1, max_steps // 2)}])"
        )


def _check_average(cfg: Any) -> None:
    """train.average and its decay and start (mars.train.average.check)."""
    from mars.train.average import check

    check(get(cfg, "train"), get(cfg, "schedule"))


_NO_PATH = (None, "", "none", "null")


def _check_start(cfg: Any) -> None:
    """train.fork_from, train.init_from and train.resume: at most one source of the first step. resume=auto
    goes with either (it continues the run dir's own checkpoints once it has some: a requeued branch
    continues itself); resume=PATH does not."""
    fork, init, resume = (get(cfg, f"train.{k}") for k in ("fork_from", "init_from", "resume"))
    if fork not in _NO_PATH and init not in _NO_PATH:
        raise ConfigError(
            f"train.fork_from={fork} and train.init_from={init}: a run starts from one of them; keep "
            "fork_from to carry the optimizer, data position and step over, init_from for the weights alone"
        )
    given = next(
        (f"train.{k}={v}" for k, v in (("fork_from", fork), ("init_from", init)) if v not in _NO_PATH), None
    )
    if given and resume not in (*_NO_PATH, "auto"):
        raise ConfigError(
            f"{given} with train.resume={resume}: a run starts from one checkpoint; drop train.resume (or "
            "use train.resume=auto, which continues this run dir's own checkpoints once it has some)"
        )


def _check_model(cfg: Any) -> None:
    """model.arch names a registered architecture whose schema the preset extends, and the values build
    one (the architecture's own checks: mars.model.spec; their ValueErrors leave validate as ConfigError)."""
    from omegaconf import OmegaConf

    from mars.model.spec import arch, arch_names, validate_model

    node = get(cfg, "model")
    name = get(cfg, "model.arch")
    spec = arch(name)
    schema = OmegaConf.get_type(node) if OmegaConf.is_config(node) else type(node)
    if schema not in (dict, spec.config):
        preset = next((n for n in arch_names() if arch(n).config is schema), "another")
        raise ConfigError(
            f"model.arch={name}, but the model preset is a model.arch={preset} one: choose a {name} preset "
            f"(model={name}_...) instead of overriding model.arch"
        )
    validate_model(node)


def _check_tokenizer(cfg: Any) -> None:
    """data.tokenizer loads, and model.vocab_size holds its vocabulary (GPT-2's: 50257 tokens)."""
    from mars.data.tokenizer import tokenizer_info
    from mars.errors import DataError

    name = str(get(cfg, "data.tokenizer"))
    try:
        info = tokenizer_info(name)
    except DataError as e:
        raise ConfigError(str(e)) from None
    vocab = int(get(cfg, "model.vocab_size"))
    if vocab < info.vocab_size:
        padded = -(-info.vocab_size // 64) * 64
        raise ConfigError(
            f"model.vocab_size={vocab} is smaller than the vocabulary of data.tokenizer={name} "
            f"({info.vocab_size} tokens); set model.vocab_size={padded} (padded to a multiple of 64)"
        )


def _check_data(cfg: Any) -> None:
    from mars.data.registry import check_values

    check_values(get(cfg, "data"))  # ConfigError, one line naming the data.* key
    val, eval_steps = int(get(cfg, "data.val_tokens")), int(get(cfg, "train.eval_steps"))
    window = int(get(cfg, "model.block_size")) + 1
    if eval_steps > 0 and val < window:
        raise ConfigError(
            f"data.val_tokens={val} holds no validation window of model.block_size + 1 = {window} tokens, "
            f"but train.eval_steps={eval_steps} asks for validation; raise data.val_tokens (the data "
            "configs use 20000 and more), or set train.eval_steps=0 to train without validation"
        )


def check_device(device: str, key: str = "train.device") -> None:
    """`key` names a device this machine has (mars.device.check): checked before a run dir or process
    group exists, or a model is loaded."""
    from mars import device as devices

    with reported_as(ConfigError):
        devices.check(key, device)


def _check_compile(cfg: Any) -> None:
    """train.compile=true where torch.compile cannot build code for the device is refused here, before
    anything is built (auto, the default, trains eagerly there: mars.train.parallel.compiles)."""
    if get(cfg, "train.compile") is not True:
        return
    from mars.device import compiler_missing, resolve

    device_type = resolve(str(get(cfg, "train.device"))).split(":")[0]
    missing = compiler_missing(device_type)
    if missing:
        raise ConfigError(
            f"train.compile=true on {device_type}: {missing}; drop train.compile (auto: compiled where it "
            "can be, eager elsewhere) or set it to false"
        )


def _check_parallel(cfg: Any, world_size: int) -> None:
    """Layouts that cannot run are refused in one line each, before any process group exists."""
    parallel, replicate = get(cfg, "train.parallel"), int(get(cfg, "train.fsdp_replicate"))
    choice("train.parallel", parallel, PARALLEL_MODES)
    at_least("train.fsdp_replicate", replicate, 1)
    if parallel != "fsdp":
        if replicate != 1:
            raise ConfigError("train.fsdp_replicate applies to train.parallel=fsdp only; drop it or use fsdp")
        return
    if world_size % replicate:
        raise ConfigError(
            f"train.fsdp_replicate={replicate} does not divide the world size {world_size}: the mesh is "
            f"replicas x shards; choose a divisor of {world_size}"
        )
    backend = get(cfg, "train.backend")
    device = str(get(cfg, "train.device"))
    if backend is not None:
        import torch

        cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
        wanted = "nccl" if cuda else "gloo"
        if backend != wanted:
            raise ConfigError(
                f"train.parallel=fsdp with train.backend={backend} on {'CUDA' if cuda else 'CPU'}: FSDP2 "
                f"runs on {wanted} there; drop train.backend (or set it to {wanted})"
            )


def _check_optimizer(cfg: Any) -> None:
    """The optimizer's own value checks (betas in [0, 1), gamma >= 0, its gamma schedule, ...)."""
    import inspect

    from omegaconf import OmegaConf

    from mars.optim import make_config

    node = get(cfg, "optimizer")
    try:
        opt = make_config(OmegaConf.to_object(node) if OmegaConf.is_config(node) else node)
        if "max_steps" in inspect.signature(opt.validate).parameters:  # a plugin's may take none
            opt.validate(max_steps=int(get(cfg, "train.max_steps")))
        else:
            opt.validate()
    except (TypeError, ValueError) as e:
        raise ConfigError(str(e)) from None
    model = get(cfg, "model")
    mup = model.get("parametrization") if hasattr(model, "get") else getattr(model, "parametrization", None)
    if mup == "mup":  # the optimizer has a muP rule (mars.optim.mup)
        from mars.optim import registered
        from mars.optim.mup import refusal

        why = refusal(opt.name, registered(opt.name).mup)
        if why:
            raise ConfigError(why)
