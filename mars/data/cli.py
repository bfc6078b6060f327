"""`mars-prepare` / `python scripts/prepare_data.py`: tokenize a dataset into shards.

    python scripts/prepare_data.py data=NAME [data.KEY=VALUE ...] [resplit=true]

The primary config is configs/prepare.yaml (``data: embedded`` by default); its schema,
``PrepareConfig``, is registered with Hydra as ``prepare_schema`` so a mistyped key fails.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from mars.data.config import DataConfig
from mars.errors import DataError

# configs/ of the checkout this package runs from, whatever the current directory.
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


@dataclass
class PrepareConfig:
    data: DataConfig = field(default_factory=DataConfig)
    # true: a directory prepared with another validation split (data.split_seed; null for every dataset
    # prepared before documents were sampled) has its shards removed and is prepared again with this one
    resplit: bool = False


ConfigStore.instance().store(name="prepare_schema", node=PrepareConfig)


def fail(message: str) -> NoReturn:
    """Exit with status 1 and the message as one line on stderr ("error: ..."), nothing else."""
    from mars.entry import EXIT_FAILED
    from mars.entry import fail as fail_with

    fail_with(message, EXIT_FAILED)


def run(cfg: DictConfig) -> Path:
    """The Hydra task: prepare ``cfg.data``; a data error or a failed write ends in one ``error:`` line."""
    from mars.data.prepare import prepare

    data_cfg: DataConfig = OmegaConf.to_object(cfg.data)
    try:
        return prepare(data_cfg, resplit=cfg.resplit)
    except DataError as e:
        fail(str(e))
    except OSError as e:  # e.g. reading a source file: the message names it
        fail(f"{e}; fix that path (permissions, free space)")


def _check(cfg: DictConfig) -> None:
    from mars.data.registry import check_values

    check_values(cfg.data)


def main() -> None:
    """The command line is composed and checked first (mars.entry): an unknown key or a bad value is one
    line and exit status 2, as for every command of the harness."""
    import hydra

    from mars.entry import EXIT_USAGE, check_hydra_command
    from mars.entry import fail as fail_with
    from mars.errors import ConfigError

    if not (CONFIG_DIR / "prepare.yaml").is_file():
        fail_with(
            f"{CONFIG_DIR / 'prepare.yaml'} not found: run mars-prepare from a source checkout "
            "(pip install -e .)",
            EXIT_USAGE,
        )
    try:
        from mars.data.registry import store_config_options

        store_config_options(CONFIG_DIR)  # data=NAME for a source a plugin registered without a YAML
        check_hydra_command(CONFIG_DIR, "prepare", sys.argv[1:], check=_check)
    except ConfigError as e:
        fail_with(str(e), EXIT_USAGE)
    hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="prepare")(run)()


if __name__ == "__main__":
    main()
