"""`python train.py [overrides]` / `mars-train [overrides]`: compose the Hydra config, check it, train.

Everything a user can get wrong is reported as ONE line on stderr (exit status 2 for config
errors, 1 for the rest) before any data is read or a process group is created:
  * composition errors (unknown group option, unknown key, wrong type) are caught by composing
    the config once up front (every combination of a -m sweep) with Hydra's compose API;
  * value errors come from mars.train.config.validate;
  * a missing dataset, a bad or mismatched checkpoint are checked on rank 0 before DDP starts.

Under torchrun every rank composes the same config, but only rank 0 keeps Hydra's output dir:
the other ranks are told not to write one, and receive rank 0's run dir once the process group
is up, so all ranks share one run dir.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
from pathlib import Path

from omegaconf import DictConfig

from mars.train.config import ConfigError, register_configs, validate
from mars.train.distributed import env_rank, env_world_size, launched_distributed

log = logging.getLogger("mars.train")

CONFIG_NAME = "config"
MAX_PRECHECKED_JOBS = 256


def config_dir() -> str:
    """The repository's configs/ (absolute, so `python train.py` and `mars-train` both find it)."""
    env = os.environ.get("MARS_CONFIG_DIR")
    if env:
        return str(Path(env).resolve())
    return str(Path(__file__).resolve().parents[2] / "configs")


# lines of Hydra / OmegaConf messages that say nothing the user can act on
_NOISE = (
    "object_type=",
    "reference_type=",
    "Set the environment variable HYDRA_FULL_ERROR",
    "Config search path:",
    "provider=",
    "To append to your config use",
)


def compose_config(overrides: list[str] | None = None, config_name: str = CONFIG_NAME) -> DictConfig:
    """The config `python train.py OVERRIDES` would run, composed in process (no run dir, no Hydra job)."""
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3", job_name="train"):
        return compose(config_name=config_name, overrides=list(overrides or []))


def one_line(e: BaseException) -> str:
    """Hydra / OmegaConf error text (often several lines, plus a cause) as one line."""
    texts = [str(e)]
    cause = e.__cause__ or e.__context__
    if cause is not None and str(cause) and str(cause) not in texts[0]:
        texts.append(str(cause))
    parts: list[str] = []
    options: list[str] = []
    for raw in "\n".join(texts).splitlines():
        line = raw.strip()
        if not line or line.startswith(_NOISE):
            continue
        if raw.startswith("\t") and parts and parts[-1].startswith("Available options"):
            options.append(line)
            continue
        if options:
            parts[-1] += " " + ", ".join(options)
            options = []
        parts.append(line)
    if options:
        parts[-1] += " " + ", ".join(options)
    return "; ".join(parts)


_FOREIGN_KEY = re.compile(r"Key '(?P<key>[^']+)' not in '(?P<cls>\w+)'\s+full_key: optimizer\.")


def optimizer_key_error(e: BaseException) -> str | None:
    """For a key the chosen optimizer does not take: one line naming the key, the optimizer and the
    keys it does take (None for any other error)."""
    from mars.optim import optimizer_names, registered

    texts = []
    while e is not None and len(texts) < 5:
        texts.append(str(e))
        e = e.__cause__ or e.__context__
    text = "\n".join(texts)
    m = _FOREIGN_KEY.search(text)
    if m is None:
        return None
    name = next((n for n in optimizer_names() if registered(n).config.__name__ == m["cls"]), None)
    if name is None:
        return None
    where = re.search(r"In '([^']+)'", text)
    source = f" (set in {where.group(1)})" if where else ""
    keys = ", ".join(k for k in registered(name).config.keys() if k != "name")
    return f"optimizer.{m['key']}{source}: optimizer={name} has no key '{m['key']}'; its keys: {keys}"


_FOREIGN_MODEL_KEY = re.compile(r"Key '(?P<key>[^']+)' not in '(?P<cls>\w+)'\s+full_key: model\.")


def model_key_error(e: BaseException) -> str | None:
    """For a key the chosen architecture does not take (a LLaMA key on a GPT-2 preset): one line naming
    the key, the architecture and the keys it does take (None for any other error)."""
    from mars.model.spec import arch, arch_names

    texts = []
    while e is not None and len(texts) < 5:
        texts.append(str(e))
        e = e.__cause__ or e.__context__
    m = _FOREIGN_MODEL_KEY.search("\n".join(texts))
    name = m and next((n for n in arch_names() if arch(n).config.__name__ == m["cls"]), None)
    if not name:
        return None
    keys = ", ".join(f.name for f in dataclasses.fields(arch(name).config) if f.name != "arch")
    others = [n for n in arch_names() if n != name and m["key"] in arch(n).config.__dataclass_fields__]
    hint = f" (a model.arch={others[0]} key: choose a model={others[0]}_... preset)" if others else ""
    return f"model.{m['key']}: model.arch={name} has no key '{m['key']}'{hint}; its keys: {keys}"


def _sweep_combinations(overrides: list[str]) -> list[list[str]]:
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides=overrides)
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [combo for batch in batches for combo in batch]


def precheck(argv: list[str]) -> None:
    """Compose (and validate) the config of every job the command line asks for; raise ConfigError."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    args = get_args_parser().parse_args(argv)
    if args.help or args.hydra_help or args.cfg or args.info or args.shell_completion or args.config_dir:
        return  # Hydra's own informational modes, or an extra config dir we do not know about
    if args.config_path is not None:
        return
    try:
        combos = _sweep_combinations(args.overrides) if args.multirun else [args.overrides]
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError(one_line(e)) from None
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3", job_name="train"):
        for i, combo in enumerate(combos[:MAX_PRECHECKED_JOBS]):
            where = f" (sweep job {' '.join(combo)})" if args.multirun else ""
            try:
                cfg = compose(config_name=args.config_name or CONFIG_NAME, overrides=combo)
                validate(cfg, env_world_size())
                _check_resume_path(cfg)
            except ConfigError as e:
                raise ConfigError(f"{e}{where}") from None
            except (HydraException, OmegaConfBaseException) as e:
                message = optimizer_key_error(e) or model_key_error(e) or one_line(e)
                raise ConfigError(f"{message}{where}") from None
            if i == 0 and env_rank() == 0:
                _check_output_dir(compose, args, combo)


def _check_resume_path(cfg) -> None:
    """train.resume=PATH holds a model of the config's architecture and shape: refused before Hydra
    makes a run dir (the other resume checks need the run dir: mars.train.rundir.choose_start)."""
    import mars.checkpoint as ckpt

    resume = cfg.train.resume
    if resume in (None, "", "none", "null", "auto"):
        return
    chosen = ckpt.resolve_checkpoint(Path(str(resume)).expanduser())
    if chosen is None:
        return  # choose_start says what train.resume should name
    try:
        ckpt.check_model_shape(chosen, cfg.model)
    except ckpt.CheckpointError as e:
        raise ConfigError(str(e)) from None


def _check_output_dir(compose, args, overrides: list[str]) -> None:
    """The directory Hydra is about to create (hydra.run.dir, or hydra.sweep.dir with -m) can be made."""
    from mars.train.rundir import check_output_dir_writable

    cfg = compose(config_name=args.config_name or CONFIG_NAME, overrides=overrides, return_hydra_config=True)
    key = "hydra.sweep.dir" if args.multirun else "hydra.run.dir"
    node = cfg.hydra.sweep if args.multirun else cfg.hydra.run
    check_output_dir_writable(str(node._get_node("dir")._value()), key)


def _rank_local_overrides() -> list[str]:
    """Non-zero ranks write no output dir or log file of their own (they use rank 0's run dir)."""
    return [
        "hydra.output_subdir=null",
        "hydra.run.dir=.",
        "hydra/job_logging=none",
        "hydra/hydra_logging=none",
    ]


def _fail(msg: str, status: int, all_ranks: bool = True) -> None:
    """Exit with one line on stderr (from rank 0 only when every rank hits the same error)."""
    if all_ranks or env_rank() == 0:
        msg = " ".join(line.strip() for line in msg.splitlines() if line.strip())
        sys.stderr.write(f"error: {msg}\n")
        sys.stderr.flush()
    sys.exit(status)


def run(cfg: DictConfig) -> str:
    """The Hydra task: checks on rank 0, then DDP, then the Trainer. Returns the Trainer's status."""
    from hydra.core.hydra_config import HydraConfig

    from mars.data import ensure_prepared
    from mars.train.distributed import adopt_slurm_env, broadcast_object, cleanup, init_distributed
    from mars.train.rundir import choose_start
    from mars.train.trainer import Trainer

    adopt_slurm_env()
    validate(cfg, env_world_size())
    if cfg.train.cpu_threads:
        import torch

        torch.set_num_threads(cfg.train.cpu_threads)
    rank0 = env_rank() == 0
    if not rank0:
        logging.getLogger().setLevel(logging.WARNING)
    run_dir, resume_from = None, None
    if rank0:
        run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
        ensure_prepared(cfg.data)
        resume_from = choose_start(cfg, run_dir, env_world_size())
    info = init_distributed(
        cfg.train.device,
        cfg.train.backend,
        need_group=cfg.train.parallel == "fsdp",
        timeout_min=cfg.train.dist_timeout_min,
    )
    try:
        run_dir, resume_from = broadcast_object((run_dir, resume_from))
        if rank0:
            log.info(f"run dir: {run_dir}  (world size {info.world_size}, device {info.device})")
        trainer = Trainer(cfg, run_dir, info, resume_from=resume_from)
        if rank0:
            n = trainer.raw_model.num_params(non_embedding=True)
            log.info(
                f"model {n / 1e6:.2f}M non-embedding params; optimizer {cfg.optimizer.name}"
                f"{' (exact)' if trainer.exact else ''}; {trainer.global_batch_size} sequences x "
                f"{cfg.model.block_size} tokens per step = {trainer.accum_steps} micro-steps of "
                f"{cfg.train.batch_size} on each of {info.world_size} rank(s)"
            )
        return trainer.fit()
    finally:
        cleanup()


def _user_errors() -> tuple[type[BaseException], ...]:
    from mars.checkpoint import CheckpointError
    from mars.data.errors import DataError
    from mars.train.trainer import TrainingDivergedError

    return (ConfigError, DataError, CheckpointError, TrainingDivergedError)


def _task(cfg: DictConfig) -> None:
    from mars.train.launch import run_on_own_gpus, wants_own_gpus

    try:
        if wants_own_gpus(cfg):
            run_on_own_gpus(cfg)
            return
        run(cfg)
    except _user_errors() as e:
        _fail(str(e), 1)


def main() -> None:
    """Console entry point (train.py and `mars-train`)."""
    import hydra

    register_configs()
    if not Path(config_dir(), f"{CONFIG_NAME}.yaml").is_file():
        _fail(
            f"no {CONFIG_NAME}.yaml in {config_dir()}: run from a source checkout (pip install -e .) "
            "or point MARS_CONFIG_DIR at the repository's configs/ directory",
            2,
        )
    try:
        precheck(sys.argv[1:])
    except ConfigError as e:
        _fail(str(e), 2, all_ranks=False)
    if launched_distributed() and env_rank() != 0:
        sys.argv.extend(_rank_local_overrides())
    hydra.main(config_path=config_dir(), config_name=CONFIG_NAME, version_base="1.3")(_task)()
