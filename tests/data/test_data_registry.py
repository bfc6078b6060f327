"""Adding a dataset: sources registered from outside the package, YAML-only Hugging Face datasets, refusals.

The sources defined here live in this test module, not in mars: they reach preparation and loading only
through the public extension point (mars.data.register_source), as a user's plugin module would.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from data_helpers import SPLIT_SEED, compose_data, expected_splits, make_docs, read_split, run_prepare

from mars.data import (
    BatchLoader,
    DataConfig,
    Source,
    ensure_prepared,
    open_dataset,
    prepare_command,
    register_source,
    source_names,
)
from mars.data import registry as registry_mod
from mars.data.layout import requested_config
from mars.data.loader import ValLoader
from mars.data.prepare import prepare  # not mars.data.prepare: once imported, that name is the module
from mars.data.registry import check_values, get_source
from mars.errors import ConfigError, DataError, ManifestError

REPO = Path(__file__).resolve().parents[2]
BUILTINS = ("embedded", "openwebtext", "fineweb_edu", "local")


@dataclass
class LinesReader(Source):
    """A custom reader: every non-blank line of the files in data.paths is a document."""

    files: list[Path]
    name: str = "lines"
    version = 1  # the reader's own identity: a new version reads other documents

    @classmethod
    def from_config(cls, cfg: DataConfig) -> LinesReader:
        if not cfg.paths:
            raise DataError("data.paths is empty: the lines reader needs files")
        files = [Path(p) for p in cfg.paths]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise DataError(f"data.paths: {missing[0]} does not exist")
        return cls(files, name=cfg.name)

    @classmethod
    def requested(cls, cfg: DataConfig) -> dict:
        return {"paths": [str(p) for p in cfg.paths], "reader": f"lines-v{cls.version}"}

    def describe(self) -> dict:
        return {"name": self.name, "files": [str(f) for f in self.files]}

    def batches(self, start: int = 0):
        docs = [line for f in self.files for line in f.read_text().splitlines() if line.strip()]
        for i in range(start, len(docs), 100):
            yield docs[i : i + 100]


@dataclass
class Synthetic(Source):
    """A generated corpus, prepared on first use like the embedded one."""

    seed: int
    name: str = "synthetic"
    prepared_on_first_use = True

    @classmethod
    def from_config(cls, cfg: DataConfig) -> Synthetic:
        return cls(cfg.seed, name=cfg.name)

    @classmethod
    def requested(cls, cfg: DataConfig) -> dict:
        return {"seed": cfg.seed}

    def describe(self) -> dict:
        return {"name": self.name, "seed": self.seed}

    def batches(self, start: int = 0):
        yield make_docs(80, seed=self.seed)[start:]


@pytest.fixture
def registry(monkeypatch):
    """The source registry, restored after the test (registrations here do not leak into other tests)."""
    source_names()  # the built-ins registered first
    monkeypatch.setattr(registry_mod, "_registry", dict(registry_mod._registry))
    return registry_mod


def write_lines(path: Path, docs: list[str]) -> Path:
    path.write_text("\n\n".join(docs) + "\n")
    return path


def test_a_source_registered_from_outside_prepares_and_trains(registry, tmp_path, monkeypatch):
    register_source("lines", LinesReader)
    assert source_names() == (*BUILTINS, "lines")
    docs = make_docs(120, seed=11)
    corpus = write_lines(tmp_path / "corpus.txt", docs)
    cfg = DataConfig(
        name="lines", root=str(tmp_path / "data"), paths=[str(corpus)], val_tokens=300, num_workers=1
    )
    check_values(cfg)  # the config check knows the registered name

    # not prepared yet: the exact prepare command, which composes back into this config
    with pytest.raises(DataError) as e:
        ensure_prepared(cfg)
    command = prepare_command(cfg)
    assert command in str(e.value) and "data.name=lines" in command
    assert compose_data(shlex.split(command)[2:]) == replace(cfg, num_workers=2)  # num_workers: not recorded

    out = prepare(cfg, progress_bar=False)
    assert out == tmp_path / "data" / "lines"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"] == {
        "name": "lines",
        "paths": [str(corpus)],
        "reader": "lines-v1",
        "val_tokens": 300,
        "shard_tokens": 100_000_000,
        "token_budget": None,
        "split_seed": SPLIT_SEED,
        "skip_bad_documents": False,
    }
    assert manifest["source"] == {"name": "lines", "files": [str(corpus)]}
    val, train = expected_splits(docs, 300, split_seed=SPLIT_SEED)
    np.testing.assert_array_equal(read_split(out, "val"), val)
    np.testing.assert_array_equal(read_split(out, "train"), train)

    # the trainer's path: open_dataset, then the batch and validation loaders
    dataset = open_dataset(cfg)
    x, y = BatchLoader(dataset.train, block_size=16, global_batch_size=4, micro_batch_size=4, seed=3).get(0)[
        0
    ]
    assert x.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    stream = torch.from_numpy(train.astype(np.int64))
    for row in x:  # every window is a slice of the prepared training tokens
        assert any(torch.equal(stream[i : i + 16], row) for i in range(len(stream) - 16))
    vx, _ = next(iter(ValLoader(dataset.val, block_size=16, micro_batch_size=2, num_sequences=2)))
    assert torch.equal(vx[0], torch.from_numpy(val[:16].astype(np.int64)))

    # the source's own identity is compared: another reader version is other documents
    monkeypatch.setattr(LinesReader, "version", 2)
    with pytest.raises(ManifestError, match=r"reader: prepared 'lines-v1', config 'lines-v2'"):
        ensure_prepared(cfg)
    with pytest.raises(ManifestError, match=r"already holds a different preparation \(reader: prepared"):
        prepare(cfg, progress_bar=False)


def test_a_registered_source_can_be_prepared_on_first_use(registry, tmp_path):
    register_source("synthetic", Synthetic)
    cfg = DataConfig(name="synthetic", root=str(tmp_path), seed=4, val_tokens=200, num_workers=1)
    dataset = open_dataset(cfg)  # no prepare command: prepared here, like the embedded corpus
    assert dataset.path == tmp_path / "synthetic"
    assert dataset.manifest["config"]["seed"] == 4 and dataset.manifest["source"] == describe(cfg)
    np.testing.assert_array_equal(
        read_split(dataset.path, "train"), expected_splits(make_docs(80, 4), 200, split_seed=SPLIT_SEED)[1]
    )
    # another seed of a shared first-use corpus is refused, naming a directory of its own
    with pytest.raises(ManifestError, match=r"data\.seed=4, not data\.seed=5.*data\.dir=synthetic_seed5"):
        ensure_prepared(replace(cfg, seed=5))


def describe(cfg: DataConfig) -> dict:
    return get_source(cfg).describe()


def test_a_yaml_only_hugging_face_dataset(tmp_path, monkeypatch):
    """configs/data/NAME.yaml naming a Hugging Face dataset, no code: read by datasets' own loader from a
    local directory (offline), prepared into data/NAME, recorded like the built-in Hugging Face sources."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    docs = make_docs(90, seed=6)
    hub = tmp_path / "hub" / "tiny_corpus"
    hub.mkdir(parents=True)
    with open(hub / "train.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"content": d, "score": 1}) + "\n")
    configs = tmp_path / "configs"
    shutil.copytree(REPO / "configs", configs)
    (configs / "data" / "tiny_corpus.yaml").write_text(
        f"name: tiny_corpus\nhf_path: {hub}\nhf_config: null\ntext_field: content\nstreaming: true\n"
        "val_tokens: 300\nshard_tokens: 100000000\n"
    )
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import mars.data.cli  # noqa: F401  (stores the prepare command's schema, prepare_schema, that prepare.yaml names)

    with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
        composed = compose(
            "prepare", ["data=tiny_corpus", f"data.root={tmp_path / 'data'}", "data.num_workers=1"]
        )
    check_values(composed.data)
    cfg: DataConfig = OmegaConf.to_object(composed.data)
    assert "tiny_corpus" not in source_names()  # nothing was registered
    run_prepare(cfg)  # the prepare command's task

    out = tmp_path / "data" / "tiny_corpus"
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["config"].items()) == [
        ("name", "tiny_corpus"),
        ("hf_path", str(hub)),
        ("hf_config", None),
        ("split", "train"),
        ("revision", None),
        ("text_field", "content"),
        ("val_tokens", 300),
        ("shard_tokens", 100_000_000),
        ("token_budget", None),
        ("split_seed", SPLIT_SEED),
        ("skip_bad_documents", False),
    ]
    val, train = expected_splits(docs, 300, split_seed=SPLIT_SEED)
    np.testing.assert_array_equal(read_split(out, "val"), val)
    np.testing.assert_array_equal(read_split(out, "train"), train)
    assert open_dataset(cfg).path == out
    # the command printed in errors works from the checkout, which lacks the YAML: it names every value
    command = prepare_command(cfg)
    assert "data.name=tiny_corpus" in command and f"data.hf_path={hub}" in command
    assert compose_data(shlex.split(command)[2:]) == replace(cfg, num_workers=2)


def test_an_unknown_source_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    line = (
        "data.name='wikipedia' is not a known source; choose one of embedded, openwebtext, fineweb_edu, "
        "local (configs/data/NAME.yaml), give data.hf_path for a Hugging Face dataset of that name, or "
        "register your own with mars.data.register_source"
    )
    cfg = DataConfig(name="wikipedia", root=str(tmp_path))
    with pytest.raises(ConfigError) as e:
        check_values(cfg)
    assert str(e.value) == line
    for use in (get_source, ensure_prepared, lambda c: prepare(c, progress_bar=False)):
        with pytest.raises(DataError) as e:
            use(cfg)
        assert str(e.value) == line
    assert not list(tmp_path.iterdir())  # refused before anything was written
    # a name that cannot be a directory, even with data.hf_path
    with pytest.raises(
        ConfigError, match=r"^data\.name='org/wiki' names the dataset's directory .* data\.name=org_wiki$"
    ):
        check_values(DataConfig(name="org/wiki", hf_path="org/wiki"))
    # the prepare command: one line, usage status, before anything runs
    from mars.data import cli

    monkeypatch.setattr(sys, "argv", ["prepare_data.py", "data.name=wikipedia", f"data.root={tmp_path}"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err == f"error: {line}\n"


def test_register_source_checks_what_it_is_given(registry):
    with pytest.raises(ValueError, match=r"'my corpus' cannot name a data source"):
        register_source("my corpus", LinesReader)
    with pytest.raises(TypeError, match=r"expected a mars.data.Source subclass or a function"):
        register_source("dicts", dict)
    with pytest.raises(
        ValueError, match=r"data source 'local' is already registered \(mars.data.local.LocalSource\)"
    ):
        register_source("local", LinesReader)
    register_source("lines", LinesReader)
    register_source("lines", LinesReader)  # the same again (a module imported twice): nothing happens

    @register_source("decorated")
    class Decorated(Synthetic):
        pass

    def factory(cfg: DataConfig) -> Source:
        return Synthetic(cfg.seed, name=cfg.name)

    register_source("made", factory)
    register_source("made", factory)
    assert source_names() == (*BUILTINS, "lines", "decorated", "made")
    assert registry.source_class("decorated") is Decorated
    made = get_source(DataConfig(name="made", seed=9))
    assert isinstance(made, Synthetic) and made.seed == 9
    # a function source records every data.* key that chooses documents
    assert requested_config(DataConfig(name="made", paths=["a.txt"]))["paths"] == ["a.txt"]
    assert set(requested_config(DataConfig(name="made"))) >= {"hf_path", "paths", "text_field", "seed"}


@pytest.mark.parametrize(
    "cfg, recorded",
    [
        (DataConfig(seed=3), {"name": "embedded", "python": None, "seed": 3}),
        (
            DataConfig(name="openwebtext"),
            {
                "name": "openwebtext",
                "hf_path": "Skylion007/openwebtext",
                "hf_config": None,
                "split": "train",
                "revision": None,
                "text_field": "text",
            },
        ),
        (
            DataConfig(name="fineweb_edu", hf_config="sample-100BT", hf_revision="r1"),
            {
                "name": "fineweb_edu",
                "hf_path": "HuggingFaceFW/fineweb-edu",
                "hf_config": "sample-100BT",
                "split": "train",
                "revision": "r1",
                "text_field": "text",
            },
        ),
        (
            DataConfig(name="local", paths=["a/*.txt"]),
            {
                "name": "local",
                "paths": ["a/*.txt"],
                "format": None,
                "text_field": "text",
                "sample_by": "document",
            },
        ),
        (
            DataConfig(name="local", paths=["b.parquet"], format="parquet", text_field="body"),
            {"name": "local", "paths": ["b.parquet"], "format": "parquet", "text_field": "body"},
        ),
    ],
)
def test_builtin_manifest_records_are_unchanged(cfg, recorded):
    """Manifests written before the registry are still the same request: byte for byte, in key order,
    but for the split seed of the sample rule after the sizes (absent from older manifests: the head
    rule, mars.data.split), which the shuffled embedded corpus does not record."""
    from mars.data.embedded import python_version

    if "python" in recorded:
        recorded["python"] = python_version()
    sizes = {
        "val_tokens": 20_000,
        "shard_tokens": 100_000_000,
        "token_budget": None,
        **({} if "python" in recorded else {"split_seed": SPLIT_SEED}),
        "skip_bad_documents": False,
    }
    assert json.dumps(requested_config(cfg)) == json.dumps({**recorded, **sizes})
