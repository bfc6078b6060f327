"""What every command of the harness does with a mistake: one line ``error: ...`` on stderr and an exit
status, never a traceback (train.py, python -m eval, scripts/prepare_data.py, scripts/export_hf.py,
scripts/report.py share this module).

Exit statuses (docs/reliability.md; the error classes that carry them: mars/errors.py):

    0    done; also a run stopped by SIGTERM / one Ctrl-C after saving its checkpoint
    1    what the command names cannot be used (data, a checkpoint, a busy run dir) or the run failed
    2    the command line is wrong: an unknown key, option or config group, a value of the wrong type,
         an unsupported ${...} interpolation, a value out of range; found before anything is written
    130  a second Ctrl-C stopped a run at once, without saving

Hydra commands compose their config up front (``compose_checked``), resolving every interpolation, so
that composition errors are reported here instead of by Hydra's multi-line message; argparse commands
use ``ArgumentParser``, whose errors are one line too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NoReturn

# the exit statuses are mars.errors'; the entry points import them from here too
from mars.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, ConfigError  # noqa: F401


def fail(message: str, status: int = EXIT_FAILED) -> NoReturn:
    """Exit with ``error: MESSAGE`` (its lines joined into one) on stderr."""
    text = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    sys.stderr.write(f"error: {text}\n")
    sys.stderr.flush()
    sys.exit(status)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with its errors as one ``error:`` line (exit status 2) instead of usage + message."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (usage: {' '.join(self.format_usage().split()[1:])})", EXIT_USAGE)


# lines of Hydra / OmegaConf messages that say nothing the user can act on
_NOISE = (
    "object_type=",
    "reference_type=",
    "Set the environment variable HYDRA_FULL_ERROR",
    "Config search path:",
    "provider=",
    "To append to your config use",
)


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


def unknown_key(e: BaseException | None):
    """The OmegaConf error behind `e` (Hydra wraps OmegaConf's) for a key that a structured config's
    schema does not have, or None. OmegaConf gives the facts as attributes: `key`, `full_key` (e.g.
    "optimizer.gamma") and `object_type` (the schema's dataclass)."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    while e is not None:
        schema = getattr(e, "object_type", None)
        if isinstance(e, (ConfigAttributeError, ConfigKeyError)) and isinstance(schema, type) and e.full_key:
            return e
        e = e.__cause__ or e.__context__
    return None


def config_file(e: BaseException) -> str | None:
    """The config file Hydra was composing when it raised `e` ("optimizer/my_adamw"), or None. Hydra says
    it only in its message ("In 'optimizer/my_adamw': ..."), not as an attribute: the one library
    message this package reads."""
    text = str(e)
    return text[4:].split("'", 1)[0] if text.startswith("In '") else None


def hydra_value(value: Any, in_list: bool = False) -> str:
    """``value`` in Hydra's override syntax: left bare when Hydra reads it back unchanged, else quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v, in_list=True) for v in value) + "]"
    from hydra.core.override_parser.overrides_parser import OverridesParser

    text = str(value)
    try:
        parsed = OverridesParser.create().parse_override(f"k=[{text}]" if in_list else f"k={text}").value()
    except Exception:
        parsed = None
    if parsed == ([text] if in_list else text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def hydra_args(argv: list[str]) -> argparse.Namespace | None:
    """Hydra's reading of a command line; None for its informational modes (--help, --cfg, ...) and for
    an extra config dir or path, where composing it here could disagree with Hydra. ConfigError when it
    asks for two modes at once (e.g. -m with --cfg)."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(argv)
    modes = {
        "--run": args.run,
        "--multirun (-m)": args.multirun,
        "--cfg": args.cfg is not None,
        "--info": args.info is not None,
        "--shell-completion": args.shell_completion,
    }
    chosen = [flag for flag, on in modes.items() if on]
    if len(chosen) > 1:  # Hydra would raise a ValueError with a traceback
        raise ConfigError(
            f"{' and '.join(chosen)} cannot be given together: Hydra runs one mode at a time (to see the "
            "config of one job of a sweep, give --cfg job with that job's overrides and no -m)"
        )
    if args.help or args.hydra_help or args.cfg or args.info or args.shell_completion or args.config_dir:
        return None
    if args.config_path is not None:
        return None
    return args


def sweep_combinations(overrides: list[str]) -> list[list[str]]:
    """The override list of every job a ``-m`` command line asks for."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides=overrides)
    batches = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return [combo for batch in batches for combo in batch]


def resolve_all(cfg) -> None:
    """Resolve every interpolation and require every mandatory value (what a run would hit later)."""
    from omegaconf import OmegaConf

    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


def is_composition_error(e: BaseException) -> bool:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return isinstance(e, (HydraException, OmegaConfBaseException))


def check_hydra_command(config_dir: str | Path, config_name: str, argv: list[str], check=None) -> None:
    """Compose the config of ``argv`` (every job of a -m sweep) as Hydra would, resolve it, and run
    ``check(cfg)``: raise ConfigError with one line for any problem, before Hydra starts."""
    from hydra import compose, initialize_config_dir

    from mars.plugins import load_plugins

    load_plugins()
    args = hydra_args(argv)
    if args is None:
        return
    try:
        combos = sweep_combinations(args.overrides) if args.multirun else [args.overrides]
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3", job_name=config_name):
            for combo in combos:
                cfg = compose(config_name=args.config_name or config_name, overrides=combo)
                resolve_all(cfg)
                if check is not None:
                    check(cfg)
    except Exception as e:
        if is_composition_error(e):
            raise ConfigError(one_line(e)) from None
        raise
