"""`mars-prepare` / `python scripts/prepare_data.py`: tokenize a dataset into shards.

    python scripts/prepare_data.py data=NAME [data.KEY=VALUE ...]

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
from mars.data.errors import DataError

# configs/ of the checkout this package runs from, whatever the current directory.
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


@dataclass
class PrepareConfig:
    data: DataConfig = field(default_factory=DataConfig)


ConfigStore.instance().store(name="prepare_schema", node=PrepareConfig)


def fail(message: str) -> NoReturn:
    """Exit with status 1 and the message as one line on stderr ("error: ..."), nothing else."""
    print(
        "error: " + " ".join(line.strip() for line in message.splitlines() if line.strip()), file=sys.stderr
    )
    sys.exit(1)


def run(cfg: DictConfig) -> Path:
    """The Hydra task: prepare ``cfg.data``; a data error or a failed write ends in one ``error:`` line."""
    from mars.data.prepare import prepare

    data_cfg: DataConfig = OmegaConf.to_object(cfg.data)
    try:
        return prepare(data_cfg)
    except DataError as e:
        fail(str(e))
    except OSError as e:  # e.g. no space left or no permission under data.root: the message names the file
        fail(f"{e}; fix that path (free space, permissions) or choose another data.root")


def main() -> None:
    import hydra

    if not (CONFIG_DIR / "prepare.yaml").is_file():
        sys.exit(
            f"error: {CONFIG_DIR / 'prepare.yaml'} not found: run mars-prepare from a source checkout "
            f"(pip install -e .)"
        )
    hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="prepare")(run)()


if __name__ == "__main__":
    main()
