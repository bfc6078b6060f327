"""mars.files.write_atomic: the one atomic write (data shards and manifests, model files, checkpoints'
parts, eval results, metrics.jsonl on resume)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mars.files import temp_name, write_atomic


def test_text_bytes_and_a_writer_function_each_replace_the_file_whole(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("old")
    write_atomic(path, "new é")
    assert path.read_bytes() == "new é".encode()
    write_atomic(path, memoryview(np.arange(3, dtype=np.uint16)))
    assert np.array_equal(np.fromfile(path, dtype=np.uint16), [0, 1, 2])
    write_atomic(path, lambda p: p.write_text("from a writer"))
    assert path.read_text() == "from a writer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_text("old")

    def half_then_fail(p):
        p.write_text("half")
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_atomic(path, half_then_fail)
    assert path.read_text() == "old"
    assert not temp_name(path).exists()


def test_fsync_flushes_the_new_contents_before_the_rename(tmp_path, monkeypatch):
    path = tmp_path / "train_000000.bin"
    synced = []
    real = os.fsync

    def record(fd):
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), path.exists()))
        return real(fd)

    monkeypatch.setattr(os, "fsync", record)
    write_atomic(path, b"x", fsync=False)
    assert synced == []
    path.unlink()
    write_atomic(path, b"x", fsync=True)
    assert synced == [(str(temp_name(path)), False)]  # the temporary file, before it had the name
