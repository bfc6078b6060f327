"""Preparation: shard contents, manifest, splits, parallel determinism, token budget, resumability."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
from data_helpers import (
    SPLIT_SEED,
    Interrupt,
    expected_splits,
    interrupt_after,
    local_cfg,
    make_docs,
    read_split,
    token_stream,
    write_jsonl,
)

from mars.data import embedded as embedded_mod
from mars.data import layout
from mars.data import prepare as prep
from mars.data import writer as writer_mod
from mars.data.config import DataConfig
from mars.data.sources import ListSource
from mars.data.tokenizer import EOT_ID, VOCAB_SIZE, get_tokenizer
from mars.errors import DataError, ManifestError

# ----------------------------------------------------------------------------- embedded corpus


def test_embedded_manifest_and_shards(embedded_dir):
    manifest = json.loads((embedded_dir / "manifest.json").read_text())
    assert manifest["tokenizer"] == "gpt2" and manifest["vocab_size"] == VOCAB_SIZE == 50257
    assert manifest["dtype"] == "uint16" and manifest["eot_id"] == EOT_ID
    assert manifest["config"]["name"] == "embedded" and manifest["config"]["val_tokens"] == 20_000
    assert manifest["source"]["python"] == embedded_mod.python_version()
    assert len(manifest["source"]["corpus_sha256"]) == 64
    val, train = manifest["splits"]["val"], manifest["splits"]["train"]
    assert val["tokens"] == 20_000
    assert train["tokens"] + val["tokens"] >= 200_000
    for split in ("val", "train"):
        for shard in manifest["splits"][split]["shards"]:
            data = (embedded_dir / shard["file"]).read_bytes()
            assert len(data) == 2 * shard["tokens"]
            assert hashlib.sha256(data).hexdigest() == shard["sha256"]
            assert np.frombuffer(data, np.uint16).max() == shard["max_token"] < VOCAB_SIZE
    tokens = read_split(embedded_dir, "train")
    assert (tokens == EOT_ID).sum() > 1000  # one EOT per document
    assert tokens[-1] == EOT_ID
    text = get_tokenizer().decode(tokens[:2000].tolist())
    assert sum(w in text.split() for w in ("the", "of", "is", "a")) == 4  # English prose


def test_embedded_documents_are_sorted_and_seeded(monkeypatch, tmp_path):
    for i, body in enumerate(
        [
            '"""Module b."""\ndef f():\n    """F doc."""\n',
            '"""Module a."""\nclass C:\n    """C doc."""\n    def m(self):\n        """M doc."""\n',
        ]
    ):
        (tmp_path / f"mod_{'ba'[i]}.py").write_text(body)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text('"""Skipped."""\n')
    monkeypatch.setattr(embedded_mod, "stdlib_dir", lambda: tmp_path)
    files = embedded_mod.stdlib_files()
    assert [f.name for f in files] == ["mod_a.py", "mod_b.py"]
    assert embedded_mod.module_documents(files[0].read_bytes()) == ["Module a.", "C doc.\n\nM doc."]
    docs1, docs2 = embedded_mod.embedded_documents(1), embedded_mod.embedded_documents(1)
    assert docs1 == docs2 and "F doc." in docs1 and "Skipped." not in docs1
    assert len(docs1) > 10  # the pydoc topics are there too
    assert embedded_mod.embedded_documents(2) != docs1 and sorted(
        embedded_mod.embedded_documents(2)
    ) == sorted(docs1)


def test_the_shared_embedded_corpus_is_never_rewritten_for_other_settings(monkeypatch, tmp_path, docs):
    """Other runs use data/embedded: another split or seed is refused (naming the key and a data.dir of
    its own), the prepared files stay as they are, and the suggested directory works."""
    monkeypatch.setattr(embedded_mod, "embedded_documents", lambda seed=1337: docs)
    cfg = DataConfig(root=str(tmp_path), num_workers=1, val_tokens=100)
    out = prep.ensure_prepared(cfg)
    assert read_split(out, "val").size == 100
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    for change, fragment in ((dict(val_tokens=200), "data.val_tokens=100, not data.val_tokens=200"),
                             (dict(seed=7), "data.seed=1337, not data.seed=7")):  # fmt: skip
        other = DataConfig(**{"root": str(tmp_path), "num_workers": 1, "val_tokens": 100, **change})
        for check in (prep.ensure_prepared, prep.check_ready, prep.prepare):
            with pytest.raises(ManifestError, match=fragment) as e:
                check(other)
            assert "other runs use it" in str(e.value) and "data.dir=embedded_" in str(e.value)
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    own = DataConfig(root=str(tmp_path), num_workers=1, val_tokens=200, dir="embedded_val200")
    assert read_split(prep.ensure_prepared(own), "val").size == 200
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_an_unwritable_data_root_is_one_error_before_anything_is_written(tmp_path):
    cfg = DataConfig(root="/proc/mars-data", num_workers=1)
    for check in (prep.check_ready, prep.ensure_prepared):
        with pytest.raises(DataError, match="/proc") as e:
            check(cfg)
        assert "data.root" in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- local files


@pytest.mark.parametrize("fmt", ["txt", "jsonl", "parquet"])
def test_local_formats_produce_the_exact_token_stream(tmp_path, docs, fmt):
    src = tmp_path / "src"
    src.mkdir()
    halves = [docs[:30], docs[30:]]
    for i, part in enumerate(halves):
        if fmt == "txt":
            for j, d in enumerate(part):
                (src / f"{i}_{j:03d}.txt").write_text(d)
        elif fmt == "jsonl":
            write_jsonl(src / f"{i}.jsonl", part)
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"text": part, "n": list(range(len(part)))}), src / f"{i}.parquet")
    cfg = local_cfg(tmp_path / "data", [src / f"*.{fmt}"], val_tokens=250, shard_tokens=700)
    out = prep.prepare(cfg, progress_bar=False)
    val, train = expected_splits(docs, 250, split_seed=SPLIT_SEED)
    np.testing.assert_array_equal(read_split(out, "val"), val)
    np.testing.assert_array_equal(read_split(out, "train"), train)
    manifest = json.loads((out / "manifest.json").read_text())
    sizes = [s["tokens"] for s in manifest["splits"]["train"]["shards"]]
    assert sizes[:-1] == [700] * (len(sizes) - 1) and 0 < sizes[-1] <= 700 and len(sizes) >= 3
    assert manifest["splits"]["train"]["tokens"] == len(train)
    assert manifest["documents"] == len(docs)
    assert manifest["source"]["format"] == {"txt": "text"}.get(fmt, fmt)
    assert len(manifest["source"]["files"]) == (60 if fmt == "txt" else 2)
    assert not (
        set(os.listdir(out))
        - {
            "manifest.json",
            "progress.json",
            ".lock",
            *(s["file"] for sp in ("val", "train") for s in manifest["splits"][sp]["shards"]),
        }
    )


def test_text_sample_by_paragraph_and_line(tmp_path):
    (tmp_path / "a.txt").write_text("one two\nthree\n\nfour five\n")
    for sample_by, expected in (("document", 1), ("paragraph", 2), ("line", 3)):
        cfg = local_cfg(tmp_path / sample_by, [tmp_path / "a.txt"], val_tokens=0, text_sample_by=sample_by)
        out = prep.prepare(cfg, progress_bar=False)
        assert (read_split(out, "train") == EOT_ID).sum() == expected


def test_parallel_workers_match_in_process(tmp_path):
    docs = make_docs(1500, seed=3)  # several batches of documents per worker
    path = write_jsonl(tmp_path / "d.jsonl", docs)
    one = prep.prepare(local_cfg(tmp_path / "w1", [path], shard_tokens=20_000), progress_bar=False)
    two = prep.prepare(
        local_cfg(tmp_path / "w2", [path], shard_tokens=20_000, num_workers=2), progress_bar=False
    )
    m1 = json.loads((one / "manifest.json").read_text())
    m2 = json.loads((two / "manifest.json").read_text())
    assert m1["splits"] == m2["splits"] and len(m1["splits"]["train"]["shards"]) > 2


def test_small_source_all_in_val_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", make_docs(3))
    with pytest.raises(DataError, match="all taken by the validation split"):
        prep.prepare(local_cfg(tmp_path / "data", [path], val_tokens=10_000), progress_bar=False)


# ----------------------------------------------------------------------------- resumability


def test_interrupted_preparation_resumes_without_touching_finished_shards(monkeypatch, tmp_path):
    docs = make_docs(400, seed=5)
    path = write_jsonl(tmp_path / "d.jsonl", docs)
    cfg = local_cfg(tmp_path / "data", [path], val_tokens=500, shard_tokens=1500)

    with monkeypatch.context() as m:
        interrupt_after(m, 3)  # val + 2 train shards finish, the 3rd train shard dies mid-write
        with pytest.raises(Interrupt):
            prep.prepare(cfg, progress_bar=False)
    out = layout.dataset_dir(cfg)
    assert not (out / "manifest.json").exists()
    with pytest.raises(DataError, match="resumes it"):
        prep.ensure_prepared(cfg)
    from mars.data.shards import open_dir

    with pytest.raises(ManifestError, match="manifest.json is missing"):
        open_dir(out)
    finished = {p.name: p.stat().st_mtime_ns for p in out.glob("*.bin")}
    assert sorted(finished) == ["train_000000.bin", "train_000001.bin", "val_000000.bin"]

    started_at = []
    from mars.data.local import LocalSource

    real_local = LocalSource.batches

    def spy(self, start=0):
        started_at.append(start)
        return real_local(self, start)

    monkeypatch.setattr(LocalSource, "batches", spy)
    prep.prepare(cfg, progress_bar=False)
    assert started_at and started_at[0] > 0  # resumed mid-stream, not from document 0
    assert {p: (out / p).stat().st_mtime_ns for p in finished} == finished  # finished shards untouched
    assert not list(out.glob(".*.tmp-*"))
    val, train = expected_splits(docs, 500, split_seed=SPLIT_SEED)
    np.testing.assert_array_equal(read_split(out, "val"), val)
    np.testing.assert_array_equal(read_split(out, "train"), train)

    reference = prep.prepare(
        local_cfg(tmp_path / "ref", [path], val_tokens=500, shard_tokens=1500), progress_bar=False
    )
    ref_manifest = json.loads((reference / "manifest.json").read_text())
    assert json.loads((out / "manifest.json").read_text())["splits"] == ref_manifest["splits"]


def test_resume_redoes_a_corrupted_or_unrecorded_shard(monkeypatch, tmp_path, capsys):
    docs = make_docs(300, seed=6)
    path = write_jsonl(tmp_path / "d.jsonl", docs)
    cfg = local_cfg(tmp_path / "data", [path], val_tokens=0, shard_tokens=1000)
    with monkeypatch.context() as m:
        interrupt_after(m, 3)
        with pytest.raises(Interrupt):
            prep.prepare(cfg, progress_bar=False)
    out = layout.dataset_dir(cfg)
    kept = {name: (out / name).stat().st_mtime_ns for name in ("train_000000.bin", "train_000002.bin")}
    with open(out / "train_000001.bin", "r+b") as f:  # damage a finished shard
        f.write(b"\xff\xff")
    prep.prepare(cfg, progress_bar=False)
    # only the damaged shard is rewritten: the stream restarts where it starts, the next one is verified
    assert {name: (out / name).stat().st_mtime_ns for name in kept} == kept
    assert (
        f"repaired {out / 'train_000001.bin'} (its sha256 did not match progress.json)"
        in capsys.readouterr().out
    )
    _, train = expected_splits(docs, 0)
    np.testing.assert_array_equal(read_split(out, "train"), train)


def test_prepare_refuses_a_directory_with_other_settings(tmp_path, docs, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", docs)
    cfg = local_cfg(tmp_path / "data", [path])
    out = prep.prepare(cfg, progress_bar=False)
    manifest = (out / "manifest.json").stat().st_mtime_ns
    assert prep.prepare(cfg, progress_bar=False) == out
    assert "(already prepared)" in capsys.readouterr().out
    assert (out / "manifest.json").stat().st_mtime_ns == manifest
    cfg.val_tokens = 400
    with pytest.raises(ManifestError, match=r"already holds a different preparation.*val_tokens"):
        prep.prepare(cfg, progress_bar=False)
    with pytest.warns(UserWarning, match="other sizes"):
        assert prep.ensure_prepared(cfg) == out
    cfg.text_field = "body"
    with pytest.raises(ManifestError, match="other documents") as e:
        prep.ensure_prepared(cfg)
    command = str(e.value).split("prepare into another directory: ")[1]
    assert command.count("data.dir=") == 1 and "data.dir=NEW_NAME" in command  # named once, not twice


def test_an_unprepared_local_corpus_without_paths_asks_for_them(tmp_path):
    """The command the refusal gives must be one that can work: without data.paths it could not."""
    cfg = local_cfg(tmp_path / "data", [])
    with pytest.raises(DataError) as e:
        prep.ensure_prepared(cfg)
    assert "and data.paths is empty: name your files" in str(e.value)
    assert "python scripts/prepare_data.py data=local" in str(e.value) and "'data.paths=[FILES...]'" in str(
        e.value
    )


# ----------------------------------------------------------------------------- write_shards directly


def test_token_budget_and_val_cut(tmp_path):
    docs = make_docs(200, seed=7)
    manifest = writer_mod.write_shards(
        ListSource(docs),
        tmp_path,
        {"name": "list"},
        val_tokens=333,
        shard_tokens=1000,
        token_budget=2500,
        workers=1,
        progress_bar=False,
    )
    val, train = expected_splits(docs, 333, token_budget=2500)
    np.testing.assert_array_equal(read_split(tmp_path, "val"), val)
    np.testing.assert_array_equal(read_split(tmp_path, "train"), train)
    assert [s["tokens"] for s in manifest["splits"]["train"]["shards"]] == [1000, 1000, 500]
    # the document cut by the val split is not in train: train starts right after an EOT
    stream, _ = token_stream(docs)
    start = len(stream) - len(expected_splits(docs, 333)[1])
    assert stream[start - 1] == EOT_ID and start > 333


def test_val_split_spanning_several_shards_resumes_mid_val(monkeypatch, tmp_path):
    docs = make_docs(200, seed=8)
    kwargs = dict(val_tokens=2500, shard_tokens=1000, workers=1, progress_bar=False)
    with monkeypatch.context() as m:
        interrupt_after(m, 2)  # two val shards finished, the third (last val shard) dies
        with pytest.raises(Interrupt):
            writer_mod.write_shards(ListSource(docs), tmp_path, {"name": "list"}, **kwargs)
    manifest = writer_mod.write_shards(ListSource(docs), tmp_path, {"name": "list"}, **kwargs)
    assert [s["tokens"] for s in manifest["splits"]["val"]["shards"]] == [1000, 1000, 500]
    val, train = expected_splits(docs, 2500)
    np.testing.assert_array_equal(read_split(tmp_path, "val"), val)
    np.testing.assert_array_equal(read_split(tmp_path, "train"), train)
