"""A missing or damaged shard: training names it and the command that rebuilds it, and that command does.

The prepare command re-checks a finished preparation (size; sha256 unless .verified.json vouches for
the file), regenerates the stream from where the first bad shard starts, and writes a regenerated
shard only when it has the sha256 the manifest records.
"""

from __future__ import annotations

import json
import re
import shlex

import numpy as np
import pytest
from data_helpers import compose_data, local_cfg, make_docs, run_prepare, write_jsonl

from mars.data import embedded as embedded_mod
from mars.data import integrity
from mars.data.config import DataConfig
from mars.data.layout import dataset_dir, prepare_command
from mars.data.prepare import ensure_prepared, prepare
from mars.data.shards import open_dataset, open_dir
from mars.errors import DamagedShardError, SourceChangedError


@pytest.fixture
def prepared(tmp_path):
    """A prepared local dataset of one jsonl file, with several train shards: (directory, cfg, docs)."""
    docs = make_docs(120, seed=21)
    path = write_jsonl(tmp_path / "d.jsonl", docs)
    cfg = local_cfg(tmp_path / "data", [path], val_tokens=300, shard_tokens=1200)
    return prepare(cfg, progress_bar=False), cfg, docs


def _snapshot(directory):
    return {p.name: p.read_bytes() for p in directory.glob("*.bin")}


def _damage(path, at: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _command_in(message: str) -> str:
    found = re.search(r"`(python scripts/prepare_data\.py [^`]*)`", message)
    assert found, message
    return found.group(1)


def _run_command(command: str) -> None:
    """Run a prepare command line in-process, as scripts/prepare_data.py would (Hydra composition)."""
    argv = shlex.split(command)
    assert argv[:2] == ["python", "scripts/prepare_data.py"]
    run_prepare(compose_data([*argv[2:], "data.num_workers=1"]))  # one process: no worker start-up


def test_following_the_training_error_rebuilds_the_damaged_shards(prepared, capsys):
    directory, cfg, _ = prepared
    intact = _snapshot(directory)
    manifest = (directory / "manifest.json").read_bytes()
    _damage(directory / "train_000001.bin")
    (directory / "train_000003.bin").unlink()
    with pytest.raises(DamagedShardError) as e:
        open_dataset(cfg)
    message = str(e.value)
    assert "\n" not in message and str(directory / "train_000001.bin") in message
    assert "sha256" in message and "corrupted" in message
    assert f"Run `{prepare_command(cfg)}` to rebuild it" in message

    _run_command(_command_in(message))  # what the message says to run
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"repaired {directory / 'train_000001.bin'} (its sha256 did not match the manifest)"
    assert out[1] == f"repaired {directory / 'train_000003.bin'} (missing)"
    assert out[2].endswith("(2 shard(s) repaired)") and len(out) == 3
    assert _snapshot(directory) == intact  # byte for byte what was prepared
    assert (directory / "manifest.json").read_bytes() == manifest
    assert open_dataset(cfg).train_tokens == json.loads(manifest)["splits"]["train"]["tokens"]


def test_prepare_checks_only_the_files_that_changed(prepared, monkeypatch, capsys):
    directory, cfg, _ = prepared
    hashed = []
    real = integrity.hash_shard
    monkeypatch.setattr(
        integrity, "hash_shard", lambda p, n, *dtype: hashed.append(p.name) or real(p, n, *dtype)
    )
    open_dir(directory)  # training verified every shard once
    n = len(hashed)
    assert n >= 4
    prepare(cfg, progress_bar=False)
    assert len(hashed) == n and "(already prepared)" in capsys.readouterr().out  # cached: no hashing
    path = directory / "train_000002.bin"
    _damage(path)
    prepare(cfg, progress_bar=False)
    assert hashed[n:] == ["train_000002.bin"]  # only the changed file was hashed
    assert "repaired" in capsys.readouterr().out
    open_dir(directory)
    assert hashed[n + 1 :] == ["train_000002.bin"]  # the rewritten file is verified from disk once


def test_a_changed_source_is_named_instead_of_rebuilt(prepared, capsys):
    directory, cfg, docs = prepared
    records = json.loads((directory / "progress.json").read_text())["shards"]
    shard = next(r for r in records if r["file"] == "train_000002.bin")
    start = records[records.index(shard) - 1]["end"][0]
    changed = list(docs)
    changed[start + 1] = changed[start + 1].replace("Document", "Paper")  # a document inside the shard
    assert cfg.paths == [str(directory.parent.parent / "d.jsonl")]
    write_jsonl(directory.parent.parent / "d.jsonl", changed)
    path = directory / shard["file"]
    _damage(path)
    damaged = path.read_bytes()
    with pytest.raises(SourceChangedError) as e:
        prepare(cfg, progress_bar=False)
    message = str(e.value)
    assert message.startswith(f"{path} cannot be rebuilt: the source now gives other tokens for it")
    assert "restore the source files as they were" in message and prepare_command(cfg) in message
    assert path.read_bytes() == damaged  # nothing different written under the old manifest
    # the prepare script reports it as one line, exit status 1
    with pytest.raises(SystemExit) as exit_:
        run_prepare(cfg)
    assert exit_.value.code == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"error: {path} cannot be rebuilt")


def test_without_progress_json_the_error_says_what_to_do(prepared):
    directory, cfg, _ = prepared
    (directory / "progress.json").unlink()
    (directory / "val_000000.bin").unlink()
    with pytest.raises(Exception, match=r"progress\.json \(where each shard starts .*\) is missing; restore"):
        prepare(cfg, progress_bar=False)


def test_open_dir_alone_names_a_command_that_rebuilds_the_directory(prepared, tmp_path):
    directory, _, _ = prepared
    intact = _snapshot(directory)
    (directory / "val_000000.bin").unlink()
    with pytest.raises(DamagedShardError, match=r"val_000000\.bin is missing") as e:
        open_dir(directory)  # no DataConfig: the command is made from the manifest's record
    _run_command(_command_in(str(e.value)))
    assert _snapshot(directory) == intact


def test_a_damaged_embedded_shard_is_rebuilt_on_first_use(monkeypatch, tmp_path, capsys):
    docs = make_docs(300, seed=22)
    monkeypatch.setattr(embedded_mod, "embedded_documents", lambda seed=1337: docs)
    cfg = DataConfig(root=str(tmp_path), num_workers=1, val_tokens=200, shard_tokens=2000)
    directory = ensure_prepared(cfg)
    intact = _snapshot(directory)
    assert len(intact) >= 3
    last = json.loads((directory / "manifest.json").read_text())["splits"]["train"]["shards"][-1]["file"]
    assert last > "train_000003.bin"  # the shorter last shard, made at the end of the stream
    _damage(directory / "train_000001.bin")
    (directory / "train_000002.bin").write_bytes(b"")
    (directory / last).unlink()
    dataset = open_dataset(cfg)  # what the trainer calls
    assert _snapshot(directory) == intact
    assert dataset.train_tokens == sum(len(np.frombuffer(b, np.uint16)) for b in intact.values()) - 200
    assert "repaired" in capsys.readouterr().out
    assert dataset_dir(cfg) == directory
