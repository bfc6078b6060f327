"""The validation split: documents sampled over the whole stream by a seed (mars.data.split), the same for
any number of tokenizer processes and after an interruption; directories split by the old rule (the
head of the stream) are named, trained on as they are, and re-split by one command."""

from __future__ import annotations

import json
import logging
import re
import shlex
from dataclasses import replace

import datasets
import numpy as np
import pytest
from data_helpers import (
    SPLIT_SEED,
    Interrupt,
    expected_splits,
    interrupt_after,
    local_cfg,
    read_split,
    run_prepare,
    splitmix64,
    write_jsonl,
)

from mars.data import local, sources, split
from mars.data import prepare as prep
from mars.data import writer as writer_mod
from mars.data.config import DataConfig
from mars.data.shards import open_dataset
from mars.data.tokenizer import EOT_ID, get_tokenizer
from mars.errors import ManifestError, SourceChangedError

FRUIT = "apple banana cherry grape lemon mango peach orange".split()
MACHINE = "engine piston gear valve clutch brake wheel motor".split()


def topic_docs(per_topic: int, seed: int = 0) -> list[str]:
    """``per_topic`` documents about fruit, then as many about machines: a corpus sorted by topic. Each
    word is one GPT-2 token (" apple"), so the topics' token ids are disjoint."""
    rng = np.random.default_rng(seed)
    return [
        " " + " ".join(rng.choice(words, size=int(rng.integers(5, 40))))
        for words in (FRUIT, MACHINE)
        for _ in range(per_topic)
    ]


def test_document_keys_are_splitmix64():
    """The published SplitMix64 outputs (seed 1234567; the first one of seed 0), and the tests' reference."""
    assert split.split_keys(1234567, 0, 5).tolist() == [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]
    assert int(split.split_keys(0, 0, 1)[0]) == 0xE220A8397B1DCDAF
    assert split.split_keys(-3, 10**9, 2).tolist() == [splitmix64(-3 % 2**64, i) for i in (10**9, 10**9 + 1)]


@pytest.fixture(scope="module")
def topics(tmp_path_factory):
    """A two-topic corpus in file order: its path, documents and each topic's token ids (disjoint)."""
    tmp = tmp_path_factory.mktemp("topics")
    docs = topic_docs(500)
    ids = get_tokenizer().encode_ordinary_batch(docs, num_threads=1)
    fruit, machine = (set().union(*map(set, half)) for half in (ids[:500], ids[500:]))
    assert not fruit & machine
    return tmp, write_jsonl(tmp / "sorted.jsonl", docs), docs, np.array(sorted(machine))


def test_both_topics_are_in_the_validation_split_in_proportion(topics):
    """A topic-sorted corpus: the validation split holds the second topic's share of the corpus within 0.1,
    for three seeds (a uniform sample of the ~170 documents 4000 tokens hold: one standard deviation is
    ~0.035); it is exactly the reference sample, no document in both splits. The head rule holds the
    first topic only."""
    tmp, path, docs, machine = topics
    stream = read_split(
        prep.prepare(local_cfg(tmp / "all", [path], val_tokens=0), progress_bar=False), "train"
    )
    words = stream[stream != EOT_ID]
    share = np.isin(words, machine).mean()
    assert 0.4 < share < 0.6
    for seed in (SPLIT_SEED, 1, 2):
        cfg = local_cfg(tmp / f"seed{seed}", [path], val_tokens=4000, split_seed=seed)
        out = prep.prepare(cfg, progress_bar=False)
        val = read_split(out, "val")
        assert abs(np.isin(val[val != EOT_ID], machine).mean() - share) < 0.1
        reference = expected_splits(docs, 4000, split_seed=seed)
        np.testing.assert_array_equal(val, reference[0])
        np.testing.assert_array_equal(read_split(out, "train"), reference[1])
        record = json.loads((out / "manifest.json").read_text())["val_split"]
        assert (record["rule"], record["seed"], record["scanned"]) == ("sample", seed, 1000)
    head = prep.prepare(local_cfg(tmp / "head", [path], val_tokens=4000, split_seed=None), progress_bar=False)
    assert not np.isin(read_split(head, "val"), machine).any()
    assert json.loads((head / "manifest.json").read_text())["val_split"] == {"rule": "head"}


def test_the_same_seed_gives_the_same_split_and_another_seed_another(topics):
    tmp, path, _, _ = topics
    splits = {}
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        out = prep.prepare(
            local_cfg(tmp / name, [path], val_tokens=3000, split_seed=seed), progress_bar=False
        )
        splits[name] = json.loads((out / "manifest.json").read_text())["splits"]
    assert splits["a"] == splits["b"]
    assert splits["a"]["val"]["shards"][0]["sha256"] != splits["c"]["val"]["shards"][0]["sha256"]
    assert splits["a"]["val"]["tokens"] == splits["c"]["val"]["tokens"] == 3000


def test_the_split_is_the_same_for_1_and_4_tokenizer_processes(topics, monkeypatch):
    """Small batches, so that many are in flight and the sample's limit falls while they are: which
    documents are tokenized first differs, the split does not."""
    tmp, path, _, _ = topics
    monkeypatch.setattr(local, "BATCH_DOCS", 16)  # the local source reads it
    manifests = [
        json.loads((prep.prepare(cfg, progress_bar=False) / "manifest.json").read_text())
        for cfg in (
            local_cfg(tmp / f"workers{n}", [path], val_tokens=3000, shard_tokens=4000, num_workers=n)
            for n in (1, 4)
        )
    ]
    one, four = manifests
    assert one["splits"] == four["splits"] and one["val_split"] == four["val_split"]
    assert len(one["splits"]["train"]["shards"]) > 2


@pytest.mark.parametrize("dies_in", ["val", "train"])
def test_a_resumed_preparation_equals_an_uninterrupted_one(tmp_path, monkeypatch, dies_in):
    """Interrupted while writing the second validation shard, or the second training shard. Resumed in
    the training split, the validation sample is not drawn again: its record says what is held out."""
    path = write_jsonl(tmp_path / "d.jsonl", topic_docs(150, seed=1))
    cfg = local_cfg(tmp_path / "data", [path], val_tokens=2500, shard_tokens=1000)  # val: 3 shards
    with monkeypatch.context() as m:
        interrupt_after(m, 1 if dies_in == "val" else 4)
        with pytest.raises(Interrupt):
            prep.prepare(cfg, progress_bar=False)
    drawn = []
    real = writer_mod.sample_val
    monkeypatch.setattr(writer_mod, "sample_val", lambda *a, **k: drawn.append(1) or real(*a, **k))
    resumed = json.loads((prep.prepare(cfg, progress_bar=False) / "manifest.json").read_text())
    assert len(drawn) == (1 if dies_in == "val" else 0)
    ref = prep.prepare(
        local_cfg(tmp_path / "ref", [path], val_tokens=2500, shard_tokens=1000), progress_bar=False
    )
    reference = json.loads((ref / "manifest.json").read_text())
    assert resumed["splits"] == reference["splits"] and resumed["val_split"] == reference["val_split"]
    assert [s["tokens"] for s in resumed["splits"]["val"]["shards"]] == [1000, 1000, 500]


def test_repair_draws_the_validation_sample_again_and_names_a_changed_source(tmp_path, capsys):
    docs = topic_docs(100, seed=2)
    path = write_jsonl(tmp_path / "d.jsonl", docs)
    cfg = local_cfg(tmp_path / "data", [path], val_tokens=1500, shard_tokens=1000)
    out = prep.prepare(cfg, progress_bar=False)
    intact = {p.name: p.read_bytes() for p in out.glob("*.bin")}
    (out / "val_000001.bin").unlink()
    (out / "train_000001.bin").write_bytes(b"")
    capsys.readouterr()
    prep.prepare(cfg, progress_bar=False)
    printed = capsys.readouterr().out
    assert f"repaired {out / 'val_000001.bin'} (missing)" in printed and "train_000001.bin" in printed
    assert {p.name: p.read_bytes() for p in out.glob("*.bin")} == intact
    # a validation document changed: the sample cannot be drawn again as recorded, nothing is written
    record = json.loads((out / "manifest.json").read_text())["val_split"]
    held = next(i for i in range(len(docs)) if splitmix64(SPLIT_SEED, i) < int(record["last_key"], 16))
    write_jsonl(path, [d + " extra words here" if i == held else d for i, d in enumerate(docs)])
    (out / "val_000000.bin").unlink()
    with pytest.raises(SourceChangedError, match="validation split cannot be drawn again|cannot be rebuilt"):
        prep.prepare(cfg, progress_bar=False)
    assert not (out / "val_000000.bin").exists()


def _old_rule(directory) -> None:
    """Make ``directory`` (prepared with data.split_seed=null) what the code before the sample rule wrote:
    no split_seed in its recorded config, no val_split."""
    for name in ("manifest.json", "progress.json"):
        record = json.loads((directory / name).read_text())
        del record["config"]["split_seed"]
        record.pop("val_split")
        (directory / name).write_text(json.dumps(record))


def test_a_directory_split_by_the_old_rule_is_named_used_and_resplit_by_one_command(tmp_path, capsys, caplog):
    docs = topic_docs(60, seed=3)
    path = write_jsonl(tmp_path / "d.jsonl", docs)
    cfg = local_cfg(tmp_path / "data", [path], val_tokens=300, shard_tokens=2000)  # the default rule
    out = prep.prepare(replace(cfg, split_seed=None), progress_bar=False)
    _old_rule(out)
    files = ("manifest.json", "progress.json", *(p.name for p in out.glob("*.bin")))
    before = {name: (out / name).read_bytes() for name in files}

    # training uses it as prepared and says what it is, and how to re-split it: once, in its log (train.log)
    caplog.set_level(logging.WARNING, logger="mars.data")
    assert prep.ensure_prepared(cfg) == out
    held_out = open_dataset(cfg).val[0]  # what the trainer reads
    (note,) = [r.getMessage() for r in caplog.records if r.name == "mars.data.prepare"]
    assert note.startswith(f"{out} was split by the old rule: its validation split is the first 300 tokens")
    assert note.endswith(" resplit=true") and "\n" not in note
    np.testing.assert_array_equal(held_out, expected_splits(docs, 300)[0])
    # the prepare command checks it and keeps it, with the same note
    capsys.readouterr()
    prep.prepare(cfg, progress_bar=False)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].endswith("(already prepared)") and printed[1] == f"note: {note}"
    assert {name: (out / name).read_bytes() for name in files} == before
    # the command in the note re-splits it
    argv = shlex.split(note[note.index("python scripts/prepare_data.py") :])
    assert argv[-1] == "resplit=true"
    from hydra import compose, initialize_config_dir

    from mars.data.cli import CONFIG_DIR, run

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        run(compose(config_name="prepare", overrides=[*argv[2:], "data.num_workers=1"]))
    assert f"re-splitting {out}" in capsys.readouterr().out
    val, train = expected_splits(docs, 300, split_seed=SPLIT_SEED)
    np.testing.assert_array_equal(read_split(out, "val"), val)
    np.testing.assert_array_equal(read_split(out, "train"), train)
    caplog.clear()
    prep.ensure_prepared(cfg)  # now without a note
    assert not caplog.records

    # another seed: refused by the prepare command, used as prepared (with the note) by training
    other = replace(cfg, split_seed=7)
    with pytest.raises(ManifestError) as e:
        prep.prepare(other, progress_bar=False)
    message = str(e.value)
    assert f"prepared with data.split_seed={SPLIT_SEED}, another sample" in message
    assert f"pass data.split_seed={SPLIT_SEED} to use it" in message and "data.split_seed=7 " in message
    assert message.endswith(" resplit=true") and "\n" not in message
    prep.ensure_prepared(other)
    assert re.search(
        f"data.split_seed={SPLIT_SEED}, another sample.*training uses it", caplog.records[-1].getMessage()
    )
    run_prepare(other, resplit=True)
    assert json.loads((out / "manifest.json").read_text())["val_split"]["seed"] == 7


def test_an_interrupted_preparation_under_the_old_rule_is_finished_under_it(tmp_path, monkeypatch, capsys):
    docs = topic_docs(60, seed=4)
    path = write_jsonl(tmp_path / "d.jsonl", docs)
    cfg = local_cfg(tmp_path / "data", [path], val_tokens=300, shard_tokens=1000)
    with monkeypatch.context() as m:
        interrupt_after(m, 2)
        with pytest.raises(Interrupt):
            prep.prepare(replace(cfg, split_seed=None), progress_bar=False)
    out = prep.dataset_dir(cfg)
    progress = json.loads((out / "progress.json").read_text())
    del progress["config"]["split_seed"]
    progress.pop("val_split")
    (out / "progress.json").write_text(json.dumps(progress))
    prep.prepare(cfg, progress_bar=False)  # not mixed: the head rule's val shard, then its training shards
    assert "was split by the old rule" in capsys.readouterr().out
    val, train = expected_splits(docs, 300)
    np.testing.assert_array_equal(read_split(out, "val"), val)
    np.testing.assert_array_equal(read_split(out, "train"), train)


def test_a_streamed_dataset_is_sampled_over_its_first_documents(tmp_path, monkeypatch):
    docs = topic_docs(150, seed=5)
    stream = datasets.IterableDataset.from_generator(lambda: ({"text": d} for d in docs))
    monkeypatch.setattr(sources, "load_dataset", lambda *a, **k: stream)
    monkeypatch.setattr(sources, "STREAM_WINDOW", 100)
    cfg = DataConfig(name="fineweb_edu", root=str(tmp_path), streaming=True, val_tokens=500, num_workers=1)
    out = prep.prepare(cfg, progress_bar=False)
    record = json.loads((out / "manifest.json").read_text())["val_split"]
    assert (record["window"], record["scanned"]) == (100, 100)
    val, train = expected_splits(docs, 500, split_seed=SPLIT_SEED, scanned=100)
    np.testing.assert_array_equal(read_split(out, "val"), val)
    np.testing.assert_array_equal(read_split(out, "train"), train)


def test_the_embedded_corpus_keeps_its_split(embedded_dir):
    """Its documents are shuffled (data.seed): the validation split is the head of them, as before."""
    manifest = json.loads((embedded_dir / "manifest.json").read_text())
    assert manifest["val_split"] == {"rule": "head"} and "split_seed" not in manifest["config"]


def test_a_resplit_waits_for_no_live_run_and_a_resume_after_it_is_refused(tmp_path):
    """resplit=true rewrites the shards: refused while a run reads them (each run holds the dataset's
    readers' lock while it lives); after it, a resume would read other documents: its loader refuses the
    checkpoint's state (the training documents' digest differs); the embedded corpus is never re-split."""
    import gc

    from mars.data.loader import BatchLoader
    from mars.data.shards import open_dataset
    from mars.errors import DataError

    docs = topic_docs(60, seed=5)
    cfg = local_cfg(tmp_path / "data", [write_jsonl(tmp_path / "d.jsonl", docs)], shard_tokens=2000)
    prep.prepare(cfg, progress_bar=False)
    live = open_dataset(cfg)  # a run's dataset

    def loader(dataset):
        return BatchLoader(dataset.train, 8, 2, 2, dataset=(str(dataset.path), dataset.train_digest))

    state = loader(live).state_dict()  # what its checkpoint holds
    other = replace(cfg, split_seed=7)
    with pytest.raises(DataError, match="resplit=true: .* is being read by a live training run"):
        prep.prepare(other, progress_bar=False, resplit=True)
    del live
    gc.collect()
    prep.prepare(other, progress_bar=False, resplit=True)  # the run has ended
    resumed = loader(open_dataset(other))
    with pytest.raises(DataError, match="was prepared again since the checkpoint .* other documents"):
        resumed.load_state_dict(state)
    with pytest.raises(DataError, match="resplit=true: the embedded corpus is never split again"):
        prep.prepare(DataConfig(root=str(tmp_path / "data")), progress_bar=False, resplit=True)
