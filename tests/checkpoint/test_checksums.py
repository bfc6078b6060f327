"""Checkpoints prove their bytes: checksums.json is written before the marker, and resume (verify_checkpoint),
export and evaluation (load_model) refuse a file whose bytes changed, in one line naming it."""

from __future__ import annotations

import json
import logging
import os
import signal
import struct
from contextlib import contextmanager

import pytest
import torch

import mars.checkpoint as ckpt
from mars.checkpoint.checksums import file_digest
from mars.model import GPT, GPTConfig

CFG = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64)


@pytest.fixture
def model():
    torch.manual_seed(0)
    return GPT(CFG)


def save(run_dir, model, sharded: bool = False):
    return ckpt.save_checkpoint(
        run_dir,
        3,
        model,
        {"step": 3},
        {"tokens": 30},
        "a: 1\n",
        keep_last=2,
        sharded=ckpt.model_templates(model) if sharded else None,
    )


def flip_low_bit(path, offset: int) -> None:
    """Flip the lowest bit of the byte at `offset`: for a little-endian float32 that starts there, the
    value changes in its last mantissa bit and stays finite (what a bit flip or a bad copy does)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def safetensors_data_start(path) -> int:
    (header_len,) = struct.unpack("<Q", path.read_bytes()[:8])
    return 8 + header_len


def one_line_error(fn, *fragments):
    with pytest.raises(ckpt.CheckpointError) as e:
        fn()
    text = str(e.value)
    assert "\n" not in text, text
    for f in fragments:
        assert f in text, text
    return text


def test_a_bit_flip_in_the_weights_is_refused_by_resume_export_and_evaluation(tmp_path, model):
    path = save(tmp_path, model)
    ckpt.verify_checkpoint(path)
    weights = path / "model.safetensors"
    flip_low_bit(weights, safetensors_data_start(weights) + 4 * 17)
    from safetensors.torch import load_file

    assert all(
        bool(torch.isfinite(t).all()) for t in load_file(weights).values()
    )  # finite: only a checksum sees it
    for load in (lambda: ckpt.verify_checkpoint(path), lambda: ckpt.load_model(tmp_path)):
        one_line_error(load, str(weights), "do not match the xxh3_128 checksum", "checksums.json")


def test_truncated_and_missing_files_are_named(tmp_path, model):
    path = save(tmp_path, model)
    state = path / "train_state.pt"
    size = state.stat().st_size
    state.write_bytes(state.read_bytes()[:-10])
    one_line_error(
        lambda: ckpt.verify_checkpoint(path), str(state), f"records {size}", "truncated or changed"
    )
    ckpt.load_model(path)  # evaluation and export read the model only: the optimizer state does not matter
    (path / "config.yaml").unlink()
    one_line_error(lambda: ckpt.verify_checkpoint(path), "config.yaml is missing (listed in")


def test_a_tampered_dcp_shard_file_is_refused(tmp_path, model):
    path = save(tmp_path, model, sharded=True)
    sums = json.loads((path / "checksums.json").read_text())["files"]
    shard_files = sorted(p for p in sums if p.startswith("sharded/"))
    assert "sharded/.metadata" in shard_files and any(p.endswith(".distcp") for p in shard_files)
    for rel in shard_files:
        assert sums[rel]["xxh3_128"] == file_digest(path / rel)
    loaded, _ = ckpt.load_model(path)
    assert torch.equal(loaded.transformer.wte.weight, model.transformer.wte.weight)

    distcp = next(path / p for p in shard_files if p.endswith(".distcp"))
    flip_low_bit(distcp, distcp.stat().st_size // 2)
    for load in (lambda: ckpt.verify_checkpoint(path), lambda: ckpt.load_model(path)):
        one_line_error(load, str(distcp), "do not match the xxh3_128 checksum")


def test_checkpoints_from_before_checksums_load_with_a_note(tmp_path, model, caplog):
    path = save(tmp_path, model)
    meta = json.loads((path / "meta.json").read_text())
    del meta["checksums"]
    (path / "meta.json").write_text(json.dumps(meta))
    (path / "checksums.json").unlink()
    with caplog.at_level(logging.WARNING, logger="mars.checkpoint"):
        ckpt.verify_checkpoint(path)
        ckpt.load_model(path)
    notes = [
        r.getMessage() for r in caplog.records if "before checkpoints carried checksums" in r.getMessage()
    ]
    assert len(notes) == 1 and str(path) in notes[0]  # said once per checkpoint


def test_a_missing_or_foreign_checksums_file_is_refused(tmp_path, model):
    path = save(tmp_path, model)
    sums = path / "checksums.json"
    text = sums.read_text()
    sums.write_text(text.replace("xxh3_128", "md5"))
    one_line_error(lambda: ckpt.verify_checkpoint(path), str(sums), "algorithm 'md5'")
    sums.unlink()
    one_line_error(lambda: ckpt.load_model(path), f"{sums} is missing, but", "meta.json says")


@contextmanager
def within(seconds: int):
    """Fail (instead of hanging the suite) when the block takes longer than `seconds`."""

    def expired(*_):
        raise TimeoutError(f"still running after {seconds} s")

    before = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def _add_entry(path, rel, size):
    sums = path / "checksums.json"
    record = json.loads(sums.read_text())
    record["files"][rel] = {"size": size, "xxh3_128": "0" * 32}
    sums.write_text(json.dumps(record))


@pytest.mark.parametrize("rel", ["/dev/zero", "../../../secret.txt", "sharded/../../x", "./model.json"])
def test_checksums_json_names_only_files_inside_its_checkpoint(tmp_path, model, rel):
    path = save(tmp_path / "run", model)
    (tmp_path / "secret.txt").write_text("x")
    _add_entry(path, rel, 0)  # size 0 of /dev/zero: hashing it would never end
    for load in (lambda: ckpt.verify_checkpoint(path), lambda: ckpt.load_model(path)):
        with within(10):
            one_line_error(load, "checksums.json: the entry", repr(rel), "is not a path inside")


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "directory"])
def test_a_listed_file_that_is_not_a_regular_file_is_refused_unread(tmp_path, model, kind):
    path = save(tmp_path, model)
    weights = path / "model.safetensors"
    weights.unlink()
    if kind == "fifo":
        os.mkfifo(weights)  # opening it for reading would wait for a writer forever
    elif kind == "directory":
        weights.mkdir()
    else:
        weights.symlink_to("/dev/zero")
    for load in (lambda: ckpt.verify_checkpoint(path), lambda: ckpt.load_model(path)):
        with within(10):
            one_line_error(load, str(weights), "is not a regular file", "checksums.json")


def test_verification_reads_no_more_than_the_recorded_size(tmp_path, monkeypatch):
    from mars.checkpoint import checksums

    big = tmp_path / "big.bin"
    big.write_bytes(b"a" * 100 + b"b" * 100)
    head = tmp_path / "head.bin"
    head.write_bytes(b"a" * 100)
    monkeypatch.setattr(checksums, "CHUNK", 64)  # the limit falls inside a chunk
    assert checksums.file_digest(big, size=100) == checksums.file_digest(head)
    assert checksums.file_digest(big) != checksums.file_digest(head)


def test_a_file_the_checksums_do_not_list_is_refused(tmp_path, model):
    path = save(tmp_path, model)
    ckpt.verify_checkpoint(path)
    extra = path / "notes.txt"
    extra.write_text("added after the save")
    one_line_error(lambda: ckpt.verify_checkpoint(path), f"{extra} is not listed in", "checksums.json")
    ckpt.load_model(path)  # evaluation and export read the model files only, each listed
    extra.unlink()
    sums = path / "checksums.json"
    record = json.loads(sums.read_text())
    del record["files"]["model.safetensors"]  # the weights, read but no longer verified
    sums.write_text(json.dumps(record))
    weights = path / "model.safetensors"
    for load in (lambda: ckpt.verify_checkpoint(path), lambda: ckpt.load_model(path)):
        one_line_error(load, f"{weights} is not listed in")
