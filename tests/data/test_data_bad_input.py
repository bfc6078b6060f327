"""Input that cannot be read: one line naming the file, the line and the fix; or skipped and counted.

Also: the local reader gives exactly the documents datasets' packaged loaders give for valid files
(so datasets prepared before it can still be rebuilt), from any resume point.
"""

from __future__ import annotations

import gzip
import json

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_helpers import (
    SPLIT_SEED,
    Interrupt,
    expected_splits,
    interrupt_after,
    local_cfg,
    make_docs,
    read_split,
    run_prepare,
)

from mars.data import local, sources
from mars.data.config import DataConfig
from mars.data.layout import dataset_dir
from mars.data.local import LocalSource
from mars.data.prepare import prepare
from mars.data.registry import get_source
from mars.errors import DataError

SKIP_HINT = ", or pass data.skip_bad_documents=true to skip bad documents"


def _prepare_error(cfg: DataConfig) -> str:
    with pytest.raises(DataError) as e:
        prepare(cfg, progress_bar=False)
    assert not (dataset_dir(cfg) / "manifest.json").exists()
    message = str(e.value)
    assert "\n" not in message
    return message


# ----------------------------------------------------------------------------- text files


@pytest.mark.parametrize(
    "sample_by, content, line, problem",
    [
        (
            "document",
            b"\x89PNG\r\n\x1a\n" + np.random.default_rng(0).bytes(3000),
            1,
            "not UTF-8 text (byte 0x89)",
        ),
        ("line", b"fine\r\nstill fine\nbad \xff here\n", 3, "not UTF-8 text (byte 0xff)"),
        ("paragraph", b"one\n\n\ntwo\nthree \x00 four\n", 5, "holds a NUL byte: binary data or UTF-16 text"),
        ("document", gzip.compress(b"compressed text", mtime=0), 1, "looks like a gzip file (name it .gz)"),
    ],
    ids=["binary", "bad-byte", "nul", "gzip"],  # stable names: pytest-xdist workers must collect alike
)
def test_a_text_file_that_is_not_text(tmp_path, sample_by, content, line, problem):
    path = tmp_path / "a.txt"
    path.write_bytes(content)
    message = _prepare_error(local_cfg(tmp_path / "data", [path], val_tokens=0, text_sample_by=sample_by))
    assert message.startswith(f"{path} line {line}: ") and problem in message
    assert message.endswith(f"; convert it to UTF-8 text or remove the file from data.paths{SKIP_HINT}")


# ----------------------------------------------------------------------------- jsonl files


@pytest.mark.parametrize(
    "bad, problem",
    [
        (b'{"text": "a" "b"}', "not valid JSON (Expecting ',' delimiter at column 14); fix the line"),
        (b'{"text": "cut off', "not valid JSON (Unterminated string starting at column 10); fix the line"),
        (b"[1, 2]", "an array, not a JSON object; fix the line"),
        (b'{"body": "x"}', "has no field 'text' (fields: 'body'); fix the line (or set data.text_field)"),
        (b'{"text": 17}', "'text' is a number, not a string; fix the line"),
        (b'{"text": null}', "'text' is null, not a string; fix the line"),
        (b'{"text": "caf\xe9"}', "not UTF-8 (byte 0xe9 at column 14); fix the line"),
    ],
)
def test_a_bad_jsonl_line_is_named_by_its_number(tmp_path, bad, problem):
    lines = [json.dumps({"text": d}).encode() for d in make_docs(100)]
    lines.insert(70, bad)
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    message = _prepare_error(local_cfg(tmp_path / "data", [path], val_tokens=0))
    assert message == f"{path} line 71: {problem}{SKIP_HINT}"


def test_a_bad_first_line_fails_before_any_work_as_one_line(tmp_path, capsys):
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"\xef\xbb\xbfnot json\n" + b'{"text": "fine"}\n' * 3)
    cfg = local_cfg(tmp_path / "data", [path], val_tokens=0)
    with pytest.raises(
        DataError, match=r"corpus\.jsonl line 1: not valid JSON \(Expecting value at column 1\)"
    ):
        get_source(cfg)
    with pytest.raises(SystemExit) as e:
        run_prepare(cfg)
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert (
        err
        == f"error: {path} line 1: not valid JSON (Expecting value at column 1); fix the line{SKIP_HINT}\n"
    )


# ----------------------------------------------------------------------------- parquet and compressed files


def test_unreadable_parquet_files(tmp_path):
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(np.random.default_rng(1).bytes(2000))
    with pytest.raises(
        DataError, match=r"garbage\.parquet: not a readable parquet file \(.*magic bytes.*\); re-create"
    ):
        get_source(local_cfg(tmp_path, [garbage]))

    numbers = tmp_path / "numbers.parquet"
    pq.write_table(pa.table({"text": [1, 2, 3]}), numbers)
    with pytest.raises(DataError, match=r"numbers\.parquet: parquet column 'text' holds int64, not text"):
        get_source(local_cfg(tmp_path, [numbers]))

    damaged = tmp_path / "damaged.parquet"
    pq.write_table(pa.table({"text": [f"row {i} " * 20 for i in range(3000)]}), damaged, row_group_size=1000)
    data = bytearray(damaged.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 200] = bytes(b ^ 0x5A for b in data[middle : middle + 200])
    damaged.write_bytes(bytes(data))
    message = _prepare_error(local_cfg(tmp_path / "d", [damaged], val_tokens=0))
    assert message.startswith(f"{damaged}: row group 1 cannot be read (") and message.endswith(
        "); re-create the file or remove it from data.paths"
    )

    nulls = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": ["a b c", "d e", None, "f"]}), nulls)
    message = _prepare_error(local_cfg(tmp_path / "n", [nulls], val_tokens=0))
    assert message == f"{nulls} row 2: 'text' is null, not a string; fix the row{SKIP_HINT}"


def test_compressed_files_need_their_codec_and_the_right_suffix(tmp_path):
    plain = tmp_path / "plain.jsonl.gz"
    plain.write_bytes(b'{"text": "not compressed"}\n')
    with pytest.raises(
        DataError,
        match=r"plain\.jsonl\.gz: cannot be read \(BadGzipFile: .*\): it is damaged or not what its suffix",
    ):
        get_source(local_cfg(tmp_path, [plain]))
    try:
        import zstandard  # noqa: F401
    except ImportError:
        zst = tmp_path / "a.txt.zst"
        zst.write_bytes(b"\x28\xb5\x2f\xfd")
        with pytest.raises(
            DataError,
            match=r"a\.txt\.zst: reading \.zst files needs the zstandard package: pip install zstandard",
        ):
            get_source(local_cfg(tmp_path, [zst]))


# ----------------------------------------------------------------------------- data.skip_bad_documents


def test_skipped_documents_are_counted_recorded_and_resumable(monkeypatch, tmp_path, capsys):
    docs = make_docs(400, seed=31)
    lines = [json.dumps({"text": d}) for d in docs]
    bad = {0: '{"text": "cut', 57: "[]", 58: '{"text": null}', 203: "garbage", 399: '{"title": "x"}'}
    for i, line in bad.items():
        lines[i] = line
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    stream = ["" if i in bad else d for i, d in enumerate(docs)]  # a skipped document keeps its index

    cfg = local_cfg(tmp_path / "data", [path], val_tokens=500, shard_tokens=1500)
    assert _prepare_error(cfg).startswith(f"{path} line 1: not valid JSON")
    cfg.skip_bad_documents = True
    out = prepare(cfg, progress_bar=False)
    val, train = expected_splits(stream, 500, split_seed=SPLIT_SEED)
    np.testing.assert_array_equal(read_split(out, "val"), val)
    np.testing.assert_array_equal(read_split(out, "train"), train)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["skipped_documents"] == 5 and manifest["documents"] == 400
    assert manifest["config"]["skip_bad_documents"] is True
    where = [e.split(": ", 1)[0] for e in manifest["skipped_examples"]]
    assert where == [f"{path} line {i + 1}" for i in sorted(bad)]
    printed = capsys.readouterr().out.splitlines()
    assert "400 documents, 5 bad ones skipped" in printed[0]
    assert printed[1].startswith("skipped 5 bad document(s) (data.skip_bad_documents=true), recorded in ")
    assert f"{path} line 1: not valid JSON" in printed[1] and len(printed) == 2

    # interrupted after a bad document and resumed: the same shards, each bad document counted once
    resumed = local_cfg(
        tmp_path / "resumed", [path], val_tokens=500, shard_tokens=1500, skip_bad_documents=True
    )
    with monkeypatch.context() as m:
        interrupt_after(m, 6)
        with pytest.raises(Interrupt):
            prepare(resumed, progress_bar=False)
    progress = json.loads((dataset_dir(resumed) / "progress.json").read_text())
    assert 0 < progress["shards"][-1]["skipped"] < 5  # it stopped between bad documents
    again = json.loads((prepare(resumed, progress_bar=False) / "manifest.json").read_text())
    assert again["splits"] == manifest["splits"]
    assert (again["skipped_documents"], again["skipped_examples"]) == (5, manifest["skipped_examples"])


def test_a_binary_file_read_by_line_is_skipped_in_constant_memory(tmp_path):
    path = tmp_path / "mixed.txt"
    garbage = b"\n".join(b"\xff\xfe binary %d" % i for i in range(3000))
    path.write_bytes(b"first line\n" + garbage + b"\nlast line\n")
    cfg = local_cfg(tmp_path / "data", [path], val_tokens=0, text_sample_by="line", skip_bad_documents=True)
    source = get_source(cfg)
    assert [d for batch in source.batches() for d in batch if d] == ["first line", "last line"]
    assert len(source.skipped.runs) == 1 and len(source.skipped.first) == 10  # one run, ten examples
    assert source.skipped.take_before(3001) == 3000 and not source.skipped.runs
    manifest = json.loads((prepare(cfg, progress_bar=False) / "manifest.json").read_text())
    assert manifest["skipped_documents"] == 3000 and manifest["documents"] == 3002
    assert manifest["skipped_examples"][0] == f"{path} line 2: not UTF-8 text (byte 0xff)"


def test_hugging_face_records_without_text_are_skipped_by_index(monkeypatch, tmp_path):
    docs = make_docs(40, seed=32)
    texts = [None if i % 10 == 3 else d for i, d in enumerate(docs)]
    monkeypatch.setattr(sources, "load_dataset", lambda *a, **k: datasets.Dataset.from_dict({"text": texts}))
    cfg = DataConfig(name="openwebtext", root=str(tmp_path), val_tokens=50, num_workers=1)
    assert _prepare_error(cfg) == (
        "Hugging Face dataset 'Skylion007/openwebtext' (default/train) record 3: 'text' is null, not a "
        f"string; set data.text_field to a text field{SKIP_HINT}"
    )
    cfg.skip_bad_documents = True
    out = prepare(cfg, progress_bar=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["skipped_documents"] == 4 and manifest["skipped_examples"][1].endswith(
        "record 13: 'text' is null, not a string"
    )
    stream = [t or "" for t in texts]
    np.testing.assert_array_equal(
        read_split(out, "train"), expected_splits(stream, 50, split_seed=SPLIT_SEED)[1]
    )


# ----------------------------------------------------------------------------- same documents as datasets


def _documents(source: LocalSource, start: int = 0) -> list[str]:
    return [d for batch in source.batches(start) for d in batch]


def _check_resume_points(source: LocalSource, reference: list[str]) -> None:
    for start in range(len(reference) + 2):
        assert _documents(source, start) == reference[start:], start


def test_local_files_read_as_datasets_loaders_read_them(tmp_path, monkeypatch):
    texts = {
        "a.txt": "one two\nthree\n\nfour five\n",
        "b.txt": "x\r\ny\rz\n\n\n\nw\r\n\r\nlast line without newline",
        "c.txt": "",
        "d.txt": "\ufeffbom\n\n\n\na\n\n\nb\n\n",
    }
    files = []
    for name, text in texts.items():
        files.append(tmp_path / name)
        files[-1].write_bytes(text.encode())
    for sample_by in ("document", "paragraph", "line"):
        loaded = datasets.load_dataset(
            "text", data_files=[str(f) for f in files], split="train", streaming=True, sample_by=sample_by
        )
        reference = [r["text"] for r in loaded]
        source = LocalSource([], files, "text", "text", sample_by)
        assert _documents(source) == reference, sample_by
        _check_resume_points(source, reference)
        with monkeypatch.context() as m:
            m.setattr(local, "_PARAGRAPH_CHUNK", 3)  # paragraphs straddle every read
            assert _documents(source) == reference, sample_by

    raw = {
        "a.jsonl": b'{"text": "a"}\n\n   \n{"text": "b", "n": 1}\r\n{"text": "\\u00e9\\ud83d\\ude00"}',
        "b.jsonl": b'\xef\xbb\xbf{"text": "after a BOM"}\n',
        "c.json": b'[{"text": "array item"}, {"text": "another"}]',
        "d.jsonl.gz": gzip.compress(b'{"text": "gzipped"}\n'),
    }
    files = []
    for name, data in raw.items():
        files.append(tmp_path / name)
        files[-1].write_bytes(data)
    loaded = datasets.load_dataset("json", data_files=[str(f) for f in files], split="train", streaming=True)
    reference = [r["text"] for r in loaded]
    source = LocalSource([], files, "jsonl", "text", "document")
    assert _documents(source) == reference and len(reference) == 7
    _check_resume_points(source, reference)

    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(30)]}), path, row_group_size=7)
    source = LocalSource([], [path, path], "parquet", "text", "document")
    _check_resume_points(source, [f"row {i}" for i in range(30)] * 2)
