"""The prepare command line: Hydra config composition, the script, the console script, error exits."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from data_helpers import (
    SPLIT_SEED,
    compose_data,
    expected_splits,
    make_docs,
    read_split,
    run_prepare,
    write_jsonl,
)

from mars.data.config import DataConfig
from mars.data.layout import dataset_dir, prepare_command

REPO = Path(__file__).resolve().parents[2]


def test_config_groups_compose_into_data_configs():
    assert compose_data([]) == DataConfig(name="embedded", val_tokens=20_000)
    fw = compose_data(["data=fineweb_edu", "data.hf_config=sample-10BT", "data.token_budget=2000000000"])
    assert (fw.name, fw.hf_path, fw.hf_config, fw.streaming, fw.token_budget) == (
        "fineweb_edu",
        "HuggingFaceFW/fineweb-edu",
        "sample-10BT",
        True,
        2_000_000_000,
    )
    owt = compose_data(["data=openwebtext"])
    assert (owt.name, owt.hf_path, owt.streaming) == ("openwebtext", "Skylion007/openwebtext", False)
    local = compose_data(["data=local", "data.paths=[a/*.txt,b.jsonl]"])
    assert local.paths == ["a/*.txt", "b.jsonl"]


def test_mistyped_key_fails():
    with pytest.raises(Exception, match="nme"):
        compose_data(["data.nme=embedded"])


def test_prepare_command_round_trips_through_hydra(tmp_path):
    cfg = DataConfig(
        name="local",
        root=str(tmp_path / "my data"),
        dir="corpus",
        paths=["with space/*.jsonl", "x.txt"],
        text_field="body",
        val_tokens=5000,
        token_budget=10**9,
    )
    command = prepare_command(cfg)
    argv = shlex.split(command)
    assert argv[:3] == ["python", "scripts/prepare_data.py", "data=local"]
    assert compose_data(argv[2:]) == cfg
    owt = DataConfig(name="openwebtext", hf_path="Skylion007/openwebtext", val_tokens=4_000_000)
    assert prepare_command(owt) == "python scripts/prepare_data.py data=openwebtext"


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_prepare_script_from_another_directory(tmp_path):
    docs = make_docs(50, seed=8)
    write_jsonl(tmp_path / "d.jsonl", docs)
    args = [
        sys.executable,
        str(REPO / "scripts" / "prepare_data.py"),
        "data=local",
        "data.paths=[d.jsonl]",
        f"data.root={tmp_path / 'out'}",
        "data.val_tokens=200",
        "data.num_workers=2",
    ]
    result = _run(args, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "train " in result.stdout and "val 200 tokens" in result.stdout
    out = tmp_path / "out" / "local"
    val, train = expected_splits(docs, 200, split_seed=SPLIT_SEED)
    assert (
        read_split(out, "val").tolist() == val.tolist()
        and read_split(out, "train").tolist() == train.tolist()
    )
    assert not (tmp_path / "outputs").exists() and not list(
        tmp_path.glob("*.log")
    )  # no Hydra run dir clutter


def test_console_script_reports_bad_input(tmp_path):
    exe = Path(sys.executable).parent / "mars-prepare"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "mars.data.cli"]
    result = _run([*cmd, "data=local", f"data.root={tmp_path}", "data.paths=[nothing/*.jsonl]"], tmp_path)
    assert result.returncode == 1
    assert "error: data.paths pattern 'nothing/*.jsonl' matches no files" in result.stderr
    assert not (dataset_dir(DataConfig(name="local", root=str(tmp_path))) / "manifest.json").exists()


def test_prepare_errors_are_one_line_with_exit_status_1(tmp_path, capsys):
    """A data error and a failed write alike: one `error:` line on stderr, nothing on stdout, status 1."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "fine"}\n{"text": "fine", }\n')
    cases = [
        (
            DataConfig(root=str(not_a_dir)),
            f"[Errno 20] Not a directory: '{not_a_dir / 'embedded'}'; fix that path",
        ),
        (
            DataConfig(name="local", root=str(tmp_path), paths=[str(bad_json)], num_workers=1),
            f"{bad_json} line 2: not valid JSON (",
        ),
    ]
    for cfg, fragment in cases:
        with pytest.raises(SystemExit) as e:
            run_prepare(cfg)
        out, err = capsys.readouterr()
        assert e.value.code == 1 and out == ""
        assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err, err
