"""Sources: selection, local-file checks, the Hugging Face paths with load_dataset replaced (no network)."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pytest
from data_helpers import SPLIT_SEED, expected_splits, local_cfg, make_docs, read_split, write_jsonl

from mars.data import prepare as prep
from mars.data import sources
from mars.data.config import DataConfig
from mars.data.registry import get_source
from mars.errors import DataError

# ----------------------------------------------------------------------------- bad input


def test_unknown_source():
    with pytest.raises(
        DataError,
        match=r"data.name='wikipedia' is not a known source; choose one of embedded, "
        r"openwebtext, fineweb_edu, local",
    ):
        get_source(DataConfig(name="wikipedia"))


def test_empty_local_file_list(tmp_path):
    with pytest.raises(DataError, match="data.paths is empty"):
        get_source(local_cfg(tmp_path, []))
    with pytest.raises(DataError, match=r"pattern '.*/none/\*\.jsonl' matches no files"):
        get_source(local_cfg(tmp_path, [tmp_path / "none" / "*.jsonl"]))
    with pytest.raises(DataError, match=r"file '.*missing\.txt' does not exist"):
        get_source(local_cfg(tmp_path, [tmp_path / "missing.txt"]))


def test_jsonl_without_the_text_field(tmp_path):
    good = write_jsonl(tmp_path / "a.jsonl", ["hello"])
    bad = write_jsonl(tmp_path / "b.jsonl", ["hello"], field="body")
    with pytest.raises(
        DataError, match=r"b\.jsonl: records have no field 'text' \(fields: \['body', 'id'\]\)"
    ):
        get_source(local_cfg(tmp_path, [good, bad]))
    assert get_source(local_cfg(tmp_path, [bad], text_field="body")).files == [bad]


def test_jsonl_record_without_the_text_field_later_in_the_file(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"text": "fine"}\n{"other": "no text here"}\n')
    with pytest.raises(DataError, match=r"mixed\.jsonl line 2: has no field 'text' \(fields: 'other'\)"):
        prep.prepare(local_cfg(tmp_path / "data", [path], val_tokens=0), progress_bar=False)


def test_parquet_without_the_text_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"content": ["a", "b"]}), path)
    with pytest.raises(DataError, match=r"x\.parquet: parquet columns \['content'\] do not include 'text'"):
        get_source(local_cfg(tmp_path, [path]))


def test_mixed_or_unknown_formats(tmp_path):
    txt, jsonl, csv = tmp_path / "a.txt", write_jsonl(tmp_path / "b.jsonl", ["x"]), tmp_path / "c.csv"
    txt.write_text("x")
    csv.write_text("x")
    with pytest.raises(DataError, match="data.paths mixes formats"):
        get_source(local_cfg(tmp_path, [txt, jsonl]))
    with pytest.raises(DataError, match=r"c\.csv: cannot tell the format from the suffix '\.csv'"):
        get_source(local_cfg(tmp_path, [csv]))
    assert get_source(local_cfg(tmp_path, [csv], format="text")).format == "text"


def test_fineweb_edu_rejects_an_unknown_sample():
    with pytest.raises(DataError, match="sample-10BT, sample-100BT, sample-350BT"):
        get_source(DataConfig(name="fineweb_edu", hf_config="sample-1T"))


def test_glob_order_is_sorted_and_duplicates_dropped(tmp_path):
    for name in ("b.jsonl", "a.jsonl", "c.jsonl"):
        write_jsonl(tmp_path / name, ["x"])
    src = get_source(local_cfg(tmp_path, [tmp_path / "c.jsonl", tmp_path / "*.jsonl"]))
    assert [f.name for f in src.files] == ["c.jsonl", "a.jsonl", "b.jsonl"]


# ----------------------------------------------------------------------------- Hugging Face sources


class FakeHub:
    """Stands in for datasets.load_dataset: serves in-memory datasets and records how it was called."""

    def __init__(self, docs, field="text"):
        self.docs, self.field, self.calls, self.served = docs, field, [], 0

    def __call__(self, path, name=None, *, split, streaming, revision=None):
        self.calls.append(
            {"path": path, "name": name, "split": split, "streaming": streaming, "revision": revision}
        )
        if not streaming:
            return datasets.Dataset.from_dict({self.field: self.docs})

        def gen():
            for d in self.docs:
                self.served += 1
                yield {self.field: d}

        return datasets.IterableDataset.from_generator(gen)


def test_fineweb_edu_streams_and_stops_at_the_token_budget(monkeypatch, tmp_path):
    docs = make_docs(3000, seed=2)
    hub = FakeHub(docs)
    monkeypatch.setattr(sources, "load_dataset", hub)
    cfg = DataConfig(
        name="fineweb_edu",
        root=str(tmp_path),
        hf_config="sample-100BT",
        streaming=True,
        token_budget=4000,
        val_tokens=500,
        shard_tokens=1500,
        num_workers=1,
    )
    out = prep.prepare(cfg, progress_bar=False)
    call = {
        "path": "HuggingFaceFW/fineweb-edu",
        "name": "sample-100BT",
        "split": "train",
        "streaming": True,
        "revision": None,
    }
    assert hub.calls == [call, call]  # streamed twice: the validation sample first, then training
    # the validation documents are sampled from about as many as the budget takes (one batch here)
    record = json.loads((out / "manifest.json").read_text())["val_split"]
    assert record["window"] == sources.STREAM_WINDOW and record["scanned"] == sources.BATCH_DOCS
    val, train = expected_splits(docs, 500, 4000, split_seed=SPLIT_SEED, scanned=record["scanned"])
    np.testing.assert_array_equal(read_split(out, "val"), val)
    np.testing.assert_array_equal(read_split(out, "train"), train)
    assert hub.served < 1500  # stopped reading soon after the budget, not at the end of the stream
    assert out.name == "fineweb_edu"


def test_openwebtext_downloaded_dataset_and_resume_skips(monkeypatch, tmp_path):
    docs = make_docs(200, seed=4)
    hub = FakeHub(docs)
    monkeypatch.setattr(sources, "load_dataset", hub)
    cfg = DataConfig(name="openwebtext", root=str(tmp_path), val_tokens=100, num_workers=1)
    src = get_source(cfg)
    assert src.hf_path == "Skylion007/openwebtext" and not src.streaming
    skipped = [d for batch in src.batches(150) for d in batch]
    assert skipped == docs[150:]
    out = prep.prepare(cfg, progress_bar=False)
    np.testing.assert_array_equal(
        read_split(out, "train"), expected_splits(docs, 100, split_seed=SPLIT_SEED)[1]
    )


def test_hf_dataset_without_the_text_field(monkeypatch, tmp_path):
    monkeypatch.setattr(sources, "load_dataset", FakeHub(["a", "b"], field="content"))
    cfg = DataConfig(name="openwebtext", root=str(tmp_path), val_tokens=0, num_workers=1)
    with pytest.raises(DataError, match=r"'Skylion007/openwebtext' \(default/train\) has no field 'text'"):
        prep.prepare(cfg, progress_bar=False)


@pytest.mark.parametrize(
    "error, message",
    [
        (
            RuntimeError("Dataset scripts are no longer supported, but found openwebtext.py"),
            "refs/convert/parquet",
        ),
        (ConnectionError("Couldn't reach 'Skylion007/openwebtext' on the Hub"), "Check the network"),
    ],
)
def test_hf_load_failures_say_what_to_do(monkeypatch, tmp_path, error, message):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(sources, "load_dataset", fail)
    cfg = DataConfig(name="openwebtext", root=str(tmp_path), num_workers=1)
    with pytest.raises(DataError, match=message):
        prep.prepare(cfg, progress_bar=False)
    assert not (tmp_path / "openwebtext" / "manifest.json").exists()
