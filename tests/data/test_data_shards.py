"""Opening a prepared dataset: every disagreement with the manifest is caught and names the file."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest
from data_helpers import local_cfg, make_docs, write_jsonl

from mars.data import integrity
from mars.data.prepare import prepare
from mars.data.shards import open_dataset, open_dir
from mars.data.tokenizer import EOT_ID
from mars.errors import DataError, ManifestError


@pytest.fixture
def prepared(tmp_path):
    """A small prepared local dataset (several train shards) and its config."""
    path = write_jsonl(tmp_path / "d.jsonl", make_docs(80, seed=11))
    cfg = local_cfg(tmp_path / "data", [path], val_tokens=300, shard_tokens=1500)
    return prepare(cfg, progress_bar=False), cfg


def _manifest(directory):
    return json.loads((directory / "manifest.json").read_text())


def test_open_dataset_memmaps_every_shard(prepared):
    directory, cfg = prepared
    ds = open_dataset(cfg)
    m = _manifest(directory)
    assert ds.path == directory and ds.manifest == m
    assert [len(a) for a in ds.train] == [s["tokens"] for s in m["splits"]["train"]["shards"]]
    assert ds.val_tokens == 300 and ds.train_tokens == m["splits"]["train"]["tokens"]
    assert all(isinstance(a, np.memmap) and a.dtype == np.uint16 for a in ds.train + ds.val)
    assert ds.train[-1][-1] == EOT_ID


def test_embedded_open_dataset_prepares_nothing_twice(embedded_cfg, embedded_dir):
    before = {p.name: p.stat().st_mtime_ns for p in embedded_dir.glob("*.bin")}
    ds = open_dataset(embedded_cfg)
    assert ds.val_tokens == 20_000 and ds.train_tokens > 200_000
    assert {p.name: p.stat().st_mtime_ns for p in embedded_dir.glob("*.bin")} == before


def test_checksums_are_cached_until_a_file_changes(prepared, monkeypatch):
    directory, _ = prepared
    calls = []
    real = integrity.hash_shard
    monkeypatch.setattr(
        integrity, "hash_shard", lambda p, n, *dtype: calls.append(p.name) or real(p, n, *dtype)
    )
    n = len(list(directory.glob("*.bin")))
    assert n >= 3
    open_dir(directory)
    assert len(calls) == n  # every shard hashed once
    open_dir(directory)
    assert len(calls) == n  # cached
    open_dir(directory, verify="full")
    assert len(calls) == 2 * n
    os.utime(directory / "train_000001.bin")  # touched: hashed again
    open_dir(directory)
    assert calls[-1] == "train_000001.bin" and len(calls) == 2 * n + 1


def test_corrupted_shard_is_caught_even_after_a_cached_check(prepared):
    directory, _ = prepared
    open_dir(directory)  # caches the verification
    path = directory / "train_000001.bin"
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match=r"train_000001\.bin: sha256 .* does not match"):
        open_dir(directory)


def test_corruption_that_keeps_mtime_is_caught_by_full_verification(prepared):
    directory, _ = prepared
    open_dir(directory)
    path = directory / "val_000000.bin"
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ManifestError, match="val_000000.bin: sha256"):
        open_dir(directory, verify="full")


def test_the_cached_check_catches_a_change_that_keeps_size_and_mtime(prepared):
    """The quick check reads a sample of each file's 1 MiB blocks against their recorded hashes: a small
    shard is read whole, so any change is caught without data.verify=full."""
    directory, _ = prepared
    open_dir(directory)  # caches size, mtime, sha256 and block hashes
    path = directory / "val_000000.bin"
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ManifestError, match="val_000000.bin: sha256 .* does not match"):
        open_dir(directory)


def test_the_sampled_blocks_of_a_large_file_include_both_ends(tmp_path):
    path = tmp_path / "train_000000.bin"
    tokens = (12 * integrity.BLOCK_BYTES + 1000) // 2  # 13 blocks, the last one short
    np.random.default_rng(0).integers(0, 50_000, tokens, dtype=np.uint16).tofile(path)
    sha, top, blocks = integrity.hash_shard(path, tokens)
    assert len(blocks) == 13 and sha == hashlib.sha256(path.read_bytes()).hexdigest()
    cache = integrity.VerifiedCache(tmp_path)
    cache.remember(path, sha, top, path.stat(), blocks)
    assert cache.max_token(path, sha, path.stat()) == top
    for _ in range(5):
        chosen = integrity.sampled_blocks(13)
        assert chosen[0] == 0 and chosen[-1] == 12 and len(chosen) == 10
    st = path.stat()
    with open(path, "r+b") as f:  # the last byte, in place
        f.seek(st.st_size - 1)
        last = f.read(1)
        f.seek(st.st_size - 1)
        f.write(bytes([last[0] ^ 1]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.max_token(path, sha, path.stat()) is None  # not vouched for: it is hashed again


def test_truncated_shard(prepared):
    directory, _ = prepared
    path = directory / "train_000000.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(
        ManifestError, match=r"train_000000\.bin: has 2998 bytes but the manifest lists 1500 uint16"
    ):
        open_dir(directory)


def test_shard_written_with_the_wrong_dtype(prepared):
    directory, _ = prepared
    path = directory / "train_000000.bin"
    path.write_bytes(np.fromfile(path, dtype=np.uint16).astype(np.uint32).tobytes())
    with pytest.raises(
        ManifestError, match=r"train_000000\.bin: holds 6000 bytes = 4 bytes per token \(uint32\?\)"
    ):
        open_dir(directory)


def test_manifest_with_an_unsupported_dtype(prepared):
    directory, _ = prepared
    m = _manifest(directory)
    m["dtype"] = "float32"
    (directory / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match=r"manifest\.json: dtype 'float32' is not supported"):
        open_dir(directory)


def test_malformed_or_missing_manifest(prepared):
    directory, _ = prepared
    (directory / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match=r"manifest\.json: cannot be read as JSON"):
        open_dir(directory)
    (directory / "manifest.json").unlink()
    with pytest.raises(ManifestError, match=r"manifest\.json is missing"):
        open_dir(directory)


def test_missing_shard(prepared):
    directory, _ = prepared
    (directory / "train_000001.bin").unlink()
    with pytest.raises(ManifestError, match=r"train_000001\.bin is missing"):
        open_dir(directory)


def test_token_id_outside_the_vocabulary(prepared):
    directory, _ = prepared
    with pytest.raises(ManifestError, match=r"val_000000\.bin: holds token id 50256 >= vocab_size 50000"):
        open_dir(directory, vocab_size=50_000)
    # a shard from another tokenizer whose manifest agrees with it byte for byte
    path = directory / "train_000000.bin"
    tokens = np.fromfile(path, dtype=np.uint16)
    tokens[5] = 60_000
    path.write_bytes(tokens.tobytes())
    m = _manifest(directory)
    m["splits"]["train"]["shards"][0]["sha256"] = hashlib.sha256(tokens.tobytes()).hexdigest()
    (directory / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match=r"train_000000\.bin: holds token id 60000 >= vocab_size 50304"):
        open_dir(directory)


def test_missing_dataset_dir_names_the_prepare_command(tmp_path):
    cfg = local_cfg(tmp_path / "nowhere", ["corpus/*.jsonl"], val_tokens=1000)
    cfg.dir = "my_corpus"
    with pytest.raises(DataError) as e:
        open_dataset(cfg)
    msg = str(e.value)
    assert str(tmp_path / "nowhere" / "my_corpus") in msg
    assert "python scripts/prepare_data.py data=local" in msg
    assert "data.dir=my_corpus" in msg and "'data.paths=[corpus/*.jsonl]'" in msg


def test_copied_dataset_opens_anywhere(prepared, tmp_path):
    directory, _ = prepared
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    assert open_dir(copy).train_tokens == open_dir(directory).train_tokens


def test_open_dataset_accepts_hydra_nodes_and_mappings(embedded_cfg):
    from dataclasses import asdict

    from omegaconf import OmegaConf

    from mars.errors import DataError

    node = OmegaConf.structured(embedded_cfg)
    assert open_dataset(node).train_tokens == open_dataset(asdict(embedded_cfg)).train_tokens > 200_000
    with pytest.raises(DataError, match=r"unknown data config keys \['nme'\]"):
        open_dataset({"nme": "embedded"})
