"""`python train.py [overrides]` / `mars-train [overrides]`: compose the Hydra config, check it, train.

Everything a user can get wrong is reported as ONE line on stderr (mars.entry: exit status 2 for
command-line errors, 1 for the rest) before any data is read or a process group is created:
  * composition errors (unknown group option, unknown key, wrong type, an interpolation the harness
    does not support) are caught by composing and resolving the config once up front (every
    combination of a -m sweep) with Hydra's compose API;
  * value errors come from mars.train.config.validate;
  * before Hydra writes anything into the run dir, rank 0 takes the run dir's lock
    (mars.train.runlock: a second run there is refused) and refuses a new run in a run dir that
    holds one (mars.train.rundir.claim); a -m sweep does the same for its sweep dir and every job
    dir (claim_sweep). The dirs are resolved as Hydra will resolve them (mars.train.hydra_dirs), so
    this holds for a `${hydra:...}` run dir too;
  * a missing or unwritable dataset, a bad or mismatched checkpoint are checked on rank 0 before DDP
    starts.

Under torchrun every rank composes the same config, but only rank 0 keeps Hydra's output dir:
the other ranks are told not to write one, and receive rank 0's run dir once the process group
is up, so all ranks share one run dir. A rank dies with its torchrun agent; when a collective fails
because another rank is gone (or silent for train.dist_timeout_min), local rank 0 of each surviving
node says so in one line, with the command that continues the run.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from mars.entry import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    config_file,
    hydra_args,
    hydra_value,
    is_composition_error,
    one_line,
    resolve_all,
    sweep_combinations,
    unknown_key,
)
from mars.errors import ConfigError, UserError
from mars.train.config import config_dir, register_configs, validate
from mars.train.distributed import (
    adopt_slurm_env,
    die_with_agent,
    env_rank,
    env_world_size,
    launched_distributed,
    peer_failure,
)
from mars.train.hydra_dirs import BASIC_LAUNCHER, drop_hydra_node, job_dir, job_subdir, launcher, output_dir

log = logging.getLogger("mars.train")

CONFIG_NAME = "config"
MAX_PRECHECKED_JOBS = 256

__all__ = ["compose_config", "config_dir", "main", "one_line", "precheck", "run"]


def compose_config(overrides: list[str] | None = None, config_name: str = CONFIG_NAME) -> DictConfig:
    """The config `python train.py OVERRIDES` would run, composed in process (no run dir, no Hydra job)."""
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3", job_name="train"):
        return compose(config_name=config_name, overrides=list(overrides or []))


def optimizer_key_error(e: BaseException) -> str | None:
    """For a key the chosen optimizer does not take: one line naming the key, the optimizer and the
    keys it does take (None for any other error)."""
    from mars.optim import optimizer_names, registered

    err = unknown_key(e)
    if err is None or not err.full_key.startswith("optimizer."):
        return None
    name = next((n for n in optimizer_names() if registered(n).config is err.object_type), None)
    if name is None:
        return None
    where = config_file(e)
    source = f" (set in {where})" if where else ""
    keys = ", ".join(k for k in registered(name).config.keys() if k != "name")
    return f"optimizer.{err.key}{source}: optimizer={name} has no key '{err.key}'; its keys: {keys}"


def model_key_error(e: BaseException) -> str | None:
    """For a key the chosen architecture does not take (a LLaMA key on a GPT-2 preset): one line naming
    the key, the architecture and the keys it does take (None for any other error)."""
    from mars.model.spec import arch, arch_names

    err = unknown_key(e)
    if err is None or not err.full_key.startswith("model."):
        return None
    name = next((n for n in arch_names() if arch(n).config is err.object_type), None)
    if not name:
        return None
    keys = ", ".join(f.name for f in dataclasses.fields(arch(name).config) if f.name != "arch")
    others = [n for n in arch_names() if n != name and err.key in arch(n).config.__dataclass_fields__]
    hint = f" (a model.arch={others[0]} key: choose a model={others[0]}_... preset)" if others else ""
    return f"model.{err.key}: model.arch={name} has no key '{err.key}'{hint}; its keys: {keys}"


def check_launch(cfg, multirun: bool, local: bool = True) -> None:
    """launch.gpus_per_job places the jobs of a sweep: refused where it would be ignored or cannot work
    (`local`: the jobs run on this machine, i.e. not through a cluster launcher such as submitit)."""
    per_job = int(cfg.launch.gpus_per_job)
    if per_job < 1 or launched_distributed():
        return
    if not multirun:
        raise ConfigError(
            f"launch.gpus_per_job={per_job} places the jobs of a sweep (python train.py -m ...) and is "
            f"ignored by a single run: drop it, or run on {per_job} GPU(s) with torchrun "
            f"--nproc_per_node={per_job} train.py ..."
        )
    if local:
        from mars.train.launch import gpu_slots, visible_gpus

        gpu_slots(visible_gpus(), per_job)  # ConfigError when this machine has too few GPUs


@dataclass
class Plan:
    """What the command line asks for, as far as main() needs it before Hydra starts."""

    multirun: bool
    cfg: DictConfig  # the first job's config
    cfgs: list[DictConfig] = field(default_factory=list)  # every job's (the first MAX_PRECHECKED_JOBS)
    out_dir: Path | None = None  # hydra.run.dir (or hydra.sweep.dir with -m), resolved (rank 0 only)
    job_dirs: list[Path | None] = field(default_factory=list)  # -m: each job's run dir (None: unknown)
    in_process: bool = False  # -m: the jobs run in this process (Hydra's basic launcher, no own GPUs)


def precheck(argv: list[str]) -> Plan | None:
    """Compose, resolve and validate the config of every job the command line asks for; raise
    ConfigError. None for Hydra's informational modes (--help, --cfg, ...), which Hydra handles."""
    from hydra import compose, initialize_config_dir

    args = hydra_args(argv)
    if args is None:
        return None
    try:
        combos = sweep_combinations(args.overrides) if args.multirun else [args.overrides]
    except Exception as e:
        if is_composition_error(e):
            raise ConfigError(one_line(e)) from None
        raise
    cfgs, places = [], []  # places: the run dir (a run), each job's sweep subdir (-m); rank 0 only
    rank0, name = env_rank() == 0, args.config_name or CONFIG_NAME
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3", job_name="train"):
        for num, combo in enumerate(combos[:MAX_PRECHECKED_JOBS]):
            where = f" (sweep job {' '.join(combo)})" if args.multirun else ""
            try:
                cfg = compose(config_name=name, overrides=combo, return_hydra_config=True)
                if rank0:
                    places.append(job_subdir(cfg, num) if args.multirun else output_dir(cfg, "hydra.run.dir"))
                cfg = drop_hydra_node(cfg)
                resolve_all(cfg)
                validate(cfg, env_world_size())
                check_launch(cfg, args.multirun, local=not any("submitit" in o for o in args.overrides))
                _check_resume_path(cfg)
            except ConfigError as e:
                raise ConfigError(f"{e}{where}") from None
            except Exception as e:
                if not is_composition_error(e):
                    raise
                message = optimizer_key_error(e) or model_key_error(e) or one_line(e)
                raise ConfigError(f"{message}{where}") from None
            cfgs.append(cfg)
        plan = Plan(multirun=bool(args.multirun), cfg=cfgs[0], cfgs=cfgs)
        if rank0:
            _place(plan, name, args.overrides, places)
            _check_sources(plan)
    return plan


def _place(plan: Plan, name: str, overrides: list[str], places: list) -> None:
    """Where Hydra will write (plan.out_dir, and plan.job_dirs of a sweep), checked that it can be made."""
    from mars.train.rundir import check_output_dir_writable

    if not plan.multirun:
        plan.out_dir = places[0]
        check_output_dir_writable(str(plan.out_dir), "hydra.run.dir")
        return
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    # the sweep dir is that of the sweep's own config, composed as Hydra composes it for -m
    try:
        master = GlobalHydra.instance().hydra.compose_config(
            name, [*overrides, "hydra.mode=MULTIRUN"], run_mode=RunMode.MULTIRUN
        )
    except Exception as e:
        if not is_composition_error(e):
            raise
        raise ConfigError(one_line(e)) from None
    plan.out_dir = output_dir(master, "hydra.sweep.dir")
    check_output_dir_writable(str(plan.out_dir), "hydra.sweep.dir")
    plan.job_dirs = [job_dir(plan.out_dir, subdir) for subdir in places]
    seen: dict[Path, int] = {}
    for num, path in enumerate(plan.job_dirs):
        if path is not None and seen.setdefault(path, num) != num:
            raise ConfigError(
                f"hydra.sweep.subdir: sweep jobs {seen[path]} and {num} would both write into {path}; make "
                "the subdir tell the jobs apart (e.g. end it with ${hydra.job.num})"
            )
    plan.in_process = launcher(master) == BASIC_LAUNCHER and all(c.launch.gpus_per_job < 1 for c in plan.cfgs)


def _check_sources(plan: Plan) -> None:
    """train.fork_from / train.init_from name a checkpoint (or HF directory) this run can start from
    (mars.train.rundir.check_source): verified, healthy, of the config's model and fixed keys."""
    from mars.train.rundir import check_source

    dirs = plan.job_dirs if plan.multirun else [plan.out_dir]
    for cfg, run_dir in zip(plan.cfgs, dirs, strict=False):
        try:
            check_source(cfg, run_dir, env_world_size())
        except ConfigError as e:
            where = f" (sweep job {run_dir})" if plan.multirun else ""
            raise ConfigError(f"{e}{where}") from None


def _check_resume_path(cfg) -> None:
    """train.resume=PATH names a complete checkpoint (else CheckpointError: what the command
    names cannot be used) holding a model of the config's architecture and shape (else ConfigError),
    checked before Hydra makes a run dir (the other resume checks need the run dir:
    mars.train.rundir.choose_start)."""
    import mars.checkpoint as ckpt

    resume = cfg.train.resume
    if resume in (None, "", "none", "null", "auto"):
        return
    chosen = ckpt.resolve_checkpoint(Path(str(resume)).expanduser())
    if chosen is None:
        raise ckpt.CheckpointError(
            f"train.resume={resume}: no complete checkpoint there; give a run dir, its ckpt/ folder or a "
            "ckpt/step_XXXXXXXX folder (or train.resume=auto)"
        )
    try:
        ckpt.check_model_shape(chosen, cfg.model)
    except ckpt.CheckpointError as e:
        raise ConfigError(str(e)) from None


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

    from mars.checkpoint import step_of
    from mars.data import ensure_prepared
    from mars.train import runlock
    from mars.train.distributed import broadcast_object, cleanup, init_distributed
    from mars.train.launch import pass_on
    from mars.train.rundir import choose_start, flush_notes
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
    with ExitStack() as stack:
        if rank0:
            run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
            stack.enter_context(runlock.hold(run_dir))  # a no-op when main() holds it already
            flush_notes()
            ensure_prepared(cfg.data)
            resume_from = choose_start(cfg, run_dir, env_world_size())
        info = init_distributed(
            cfg.train.device,
            cfg.train.backend,
            need_group=cfg.train.parallel == "fsdp",
            timeout_min=cfg.train.dist_timeout_min,
        )
        trainer = None
        try:
            run_dir, resume_from = broadcast_object((run_dir, resume_from))
            if resume_from is not None and step_of(resume_from) >= cfg.train.max_steps:
                if rank0:
                    log.info(
                        f"nothing to train: {resume_from} is at step {step_of(resume_from)} = "
                        f"train.max_steps, the run is complete (raise train.max_steps to train on)"
                    )
                return "completed"
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
            status = trainer.fit()
            if status == "preempted":
                pass_on(trainer.stop_signal)  # submitit's signal: it requeues the job now that it is saved
            return status
        except Exception as e:
            lost = peer_failure(e) if info.distributed else None
            if lost is None:
                raise
            raise LostRankError(_lost_rank_line(lost, trainer, run_dir, info.rank, info.world_size)) from None
        finally:
            cleanup()


class LostRankError(RuntimeError):
    """A collective failed because another rank (or its node) is gone or does not answer."""


def _lost_rank_line(lost: str, trainer, run_dir: Path, rank: int, world_size: int) -> str:
    """What a surviving rank says when another rank is gone, with the command that continues the run."""
    from mars.checkpoint import CKPT_DIR, latest_checkpoint
    from mars.train.rundir import resume_command

    when = f" after step {trainer.state.step}" if trainer is not None else ""
    newest = latest_checkpoint(run_dir / CKPT_DIR)
    saved = f"its newest checkpoint is {newest.name}" if newest else "it has no checkpoint yet"
    return (
        f"rank {rank} lost contact with another rank{when} ({lost}): a rank or node of this run stopped "
        f"(its own log says why) or the network failed; {saved}: continue with: "
        f"{resume_command(run_dir, world_size)}"
    )


def _interrupted_line() -> str:
    """The line of a run stopped by a second Ctrl-C, with the command that continues it."""
    from hydra.core.hydra_config import HydraConfig

    from mars.train.rundir import resume_command

    text = (
        "interrupted by Ctrl-C: stopped at once, without saving a checkpoint (a single Ctrl-C or SIGTERM "
        "during training finishes the step and saves one)"
    )
    try:
        run_dir = Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # noqa: BLE001 - Hydra's job had not started
        return text
    return f"{text}; the checkpoints in {run_dir} are intact: continue with {resume_command(run_dir)}"


def _own_run_dir() -> Path | None:
    """Rank 0's run dir (where it records the outcome); None on the other ranks."""
    from hydra.core.hydra_config import HydraConfig

    return Path(HydraConfig.get().runtime.output_dir) if env_rank() == 0 else None


def _task(cfg: DictConfig) -> None:
    from mars.train.launch import run_on_own_gpus, wants_own_gpus
    from mars.train.outcome import recorded

    try:
        if wants_own_gpus(cfg):
            run_on_own_gpus(cfg)
            return
        with recorded(_own_run_dir()) as outcome:  # RUN_DIR/outcome.json (mars.train.outcome)
            outcome.status = run(cfg)
    except UserError as e:
        _fail(str(e), EXIT_FAILED)
    except LostRankError as e:  # every surviving rank got here: one line per node
        _fail(str(e), EXIT_FAILED, all_ranks=os.environ.get("LOCAL_RANK", "0") == "0")
    except KeyboardInterrupt:
        _fail(_interrupted_line(), EXIT_INTERRUPTED, all_ranks=False)


def _claim(plan: Plan | None, stack: ExitStack) -> None:
    """On rank 0, before Hydra writes anything: check the dataset can be used (or prepared), hold the run
    dir (or the sweep dir and its job dirs) and apply the run dir rules (mars.train.rundir.claim,
    claim_sweep); add the resolved dir to Hydra's overrides so that Hydra writes exactly where the lock
    is."""
    from mars.data.prepare import check_ready
    from mars.train import runlock
    from mars.train.rundir import claim, claim_sweep

    if plan is None or env_rank() != 0:
        return
    if not plan.multirun:
        check_ready(plan.cfg.data)  # a missing or unwritable dataset: before anything is written
    key = "hydra.sweep.dir" if plan.multirun else "hydra.run.dir"
    stack.enter_context(runlock.hold(plan.out_dir, key))
    if plan.multirun:
        claim_sweep(plan.cfgs, plan.out_dir, plan.job_dirs, keep=stack if plan.in_process else None)
    else:
        claim(plan.cfg, plan.out_dir)
    sys.argv.append(f"{key}={hydra_value(str(plan.out_dir))}")


def main() -> None:
    """Console entry point (train.py and `mars-train`)."""
    import hydra

    try:
        try:
            register_configs()
        except ConfigError as e:
            _fail(str(e), EXIT_USAGE)
        adopt_slurm_env()  # `srun python train.py`: know this task's rank before choosing who writes
        die_with_agent()  # under torchrun: a rank does not outlive its agent
        if not Path(config_dir(), f"{CONFIG_NAME}.yaml").is_file():
            _fail(
                f"no {CONFIG_NAME}.yaml in {config_dir()}: run from a source checkout (pip install -e .) "
                "or point MARS_CONFIG_DIR at the repository's configs/ directory",
                EXIT_USAGE,
            )
        try:
            plan = precheck(sys.argv[1:])
        except ConfigError as e:
            _fail(str(e), EXIT_USAGE, all_ranks=False)
        except UserError as e:  # train.resume=PATH without a checkpoint: before any run dir exists
            _fail(str(e), EXIT_FAILED, all_ranks=False)
        if launched_distributed() and env_rank() != 0:
            sys.argv.extend(_rank_local_overrides())
        with ExitStack() as stack:
            try:
                _claim(plan, stack)
            except UserError as e:
                _fail(str(e), EXIT_FAILED)
            hydra.main(config_path=config_dir(), config_name=CONFIG_NAME, version_base="1.3")(_task)()
    except KeyboardInterrupt:
        _fail("interrupted by Ctrl-C before training started; nothing was saved", EXIT_INTERRUPTED, False)
