"""One behaviour for every command (mars.entry): an unknown key or option, a value of the wrong type, an
unsupported interpolation or a bad value is one line `error: ...` on stderr and exit status 2, with
nothing written: train.py, python -m eval, scripts/prepare_data.py, scripts/export_hf.py and
scripts/report.py."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"_entry_{name}", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _hydra_command(module: str, prog: str):
    def call(args: list[str]) -> int:
        main = importlib.import_module(module).main
        old = sys.argv
        sys.argv = [prog, *args]
        try:
            main()
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else 1
        finally:
            sys.argv = old
        return 0

    return call


def _argparse_command(get_main):
    def call(args: list[str]) -> int:
        try:
            return get_main()(args)
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else 1

    return call


COMMANDS = {
    "train": _hydra_command("mars.train.cli", "train.py"),
    "eval": _hydra_command("mars.eval.cli", "eval"),
    "prepare": _hydra_command("mars.data.cli", "prepare_data.py"),
    "export": _argparse_command(lambda: _script("export_hf")),
    "report": _argparse_command(lambda: importlib.import_module("mars.analysis.cli").report_main),
}

CASES = [
    ("train", ["train.nope=1", "hydra.run.dir={tmp}/run"], "Key 'nope' not in 'TrainConfig'"),
    ("train", ["train.max_steps=0", "hydra.run.dir={tmp}/run"], "train.max_steps=0 must be >= 1"),
    ("eval", ["nope=1", "ckpt={tmp}/run", "out={tmp}/out"], "Key 'nope' not in 'EvalConfig'"),
    ("eval", ["limit=${{eval:1+1}}", "ckpt={tmp}/run"], "Unsupported interpolation type eval"),
    ("eval", ["batch_size=0", "ckpt={tmp}/run"], "batch_size >= 1"),
    ("prepare", ["data.nme=1", "data.root={tmp}/data"], "Key 'nme' not in 'DataConfig'"),
    ("prepare", ["data=owt", "data.root={tmp}/data"], "Could not find 'data/owt'"),
    ("prepare", ["data.shard_tokens=0", "data.root={tmp}/data"], "data.shard_tokens=0 must be >= 1"),
    ("export", ["--forse", "{tmp}/run", "{tmp}/out"], "unrecognized arguments: --forse (usage: export_hf.py"),
    ("report", ["--bogus", "{tmp}/sweep"], "unrecognized arguments: --bogus"),
    ("report", ["{tmp}", "--out", "{tmp}/notes.txt"], "--out {tmp}/notes.txt is a file"),
]


@pytest.mark.parametrize("command, args, fragment", CASES, ids=[f"{c}:{a[0]}" for c, a, _ in CASES])
def test_every_command_says_one_line_and_exits_2(command, args, fragment, tmp_path, capsys, restore_logging):
    (tmp_path / "notes.txt").write_text("not a directory\n")
    before = sorted(tmp_path.rglob("*"))
    code = COMMANDS[command]([a.format(tmp=tmp_path) for a in args])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment.format(tmp=tmp_path) in lines[0]
    assert "Traceback" not in out + err and "HYDRA_FULL_ERROR" not in err
    assert sorted(tmp_path.rglob("*")) == before  # nothing written
