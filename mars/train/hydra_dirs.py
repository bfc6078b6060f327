"""Where Hydra is about to write, known before it starts: the run dir of a run, the sweep dir and every
job dir of a -m sweep, resolved the way Hydra resolves them once a job runs.

hydra.run.dir, hydra.sweep.dir and hydra.sweep.subdir may use interpolations that only a running job
can resolve: `${hydra:runtime.choices.optimizer}`, `${hydra:job.override_dirname}`, `${hydra.job.num}`.
Hydra resolves them (hydra.core.utils.run_job) with the job's composed config installed in its
HydraConfig singleton. Here the same composed config is installed for the moment of the lookup (the
previous one is put back), with hydra.job.num / hydra.job.id as the sweep's launcher sets them, so that
the run dir's lock and rules (mars.train.cli._claim) come before Hydra writes anything, whatever the
expression. Nothing here creates a directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from mars.entry import one_line
from mars.errors import ConfigError

BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"

# hydra.job.id as each launcher sets it for job `num` (hydra.job.num is `num` with every launcher); a
# launcher not listed sets it only where the job runs (submitit: the SLURM job id)
_JOB_IDS: dict[str, Callable[[str, int], object]] = {
    BASIC_LAUNCHER: lambda name, num: num,
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher": lambda name, num: f"{name}_{num}",
}


@contextmanager
def _as_hydra_config(cfg: DictConfig):
    """`${hydra:...}` resolves against cfg's hydra node for the block."""
    from hydra.core.hydra_config import HydraConfig

    instance = HydraConfig.instance()
    before = instance.cfg
    instance.set_config(cfg)
    try:
        yield
    finally:
        instance.cfg = before


def _resolve(cfg: DictConfig, key: str) -> str:
    with _as_hydra_config(cfg):
        return str(OmegaConf.select(cfg, key, throw_on_resolution_failure=True))


def launcher(cfg: DictConfig) -> str:
    """The launcher's class (`_target_`) of a config composed with its hydra node."""
    return str(OmegaConf.select(cfg, "hydra.launcher._target_", default=""))


def output_dir(cfg: DictConfig, key: str) -> Path:
    """hydra.run.dir (of a run's config) or hydra.sweep.dir (of a sweep's, composed for -m), absolute;
    ConfigError naming the key when it cannot be resolved."""
    try:
        text = _resolve(cfg, key)
    except Exception as e:  # noqa: BLE001 - an interpolation error of OmegaConf or a resolver
        parent, name = key.rsplit(".", 1)
        raw = OmegaConf.to_container(OmegaConf.select(cfg, parent), resolve=False)[name]
        raise ConfigError(f"{key}={raw} cannot be resolved: {one_line(e)}; give {key} a path") from None
    return Path(os.path.abspath(Path(text).expanduser()))


def job_subdir(cfg: DictConfig, num: int) -> str | None:
    """hydra.sweep.subdir of job `num` of a sweep (cfg: that job's config composed with its hydra node);
    Hydra writes the job into SWEEP_DIR/SUBDIR (job_dir). None when only the running job can know it (a
    subdir that uses hydra.job.id under a launcher that sets it on the cluster)."""
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.job.num = num
        job_id = _JOB_IDS.get(launcher(cfg))
        if job_id is not None:
            cfg.hydra.job.id = job_id(str(cfg.hydra.job.name), num)
    try:
        return _resolve(cfg, "hydra.sweep.subdir")
    except Exception:  # noqa: BLE001 - checked in the job itself, under its own lock
        return None


def job_dir(sweep_dir: Path, subdir: str | None) -> Path | None:
    """The run dir of a sweep job, joined as Hydra joins it (hydra.core.utils.run_job)."""
    return None if subdir is None else Path(os.path.abspath(os.path.join(sweep_dir, subdir)))


def drop_hydra_node(cfg: DictConfig) -> DictConfig:
    """cfg without its hydra node: what Hydra's compose() returns without return_hydra_config."""
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg
