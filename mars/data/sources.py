"""Document sources: each yields the documents of a dataset as batches of strings, in a fixed order.

A source is chosen by ``data.name``:
    embedded     English prose shipped inside Python (mars.data.embedded), no network
    openwebtext  Hugging Face "Skylion007/openwebtext"
    fineweb_edu  Hugging Face "HuggingFaceFW/fineweb-edu" sample-10BT | sample-100BT | sample-350BT, streamed
    local        text, jsonl or parquet files given by paths or globs, read through datasets' packaged loaders

``Source.batches(start)`` yields lists of document texts beginning at document index ``start``, so
an interrupted preparation resumes without re-tokenizing what it already wrote.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mars.data.config import DataConfig
from mars.data.errors import SourceError

BATCH_DOCS = 512

HF_DEFAULTS = {
    "openwebtext": {"hf_path": "Skylion007/openwebtext", "hf_config": None},
    "fineweb_edu": {"hf_path": "HuggingFaceFW/fineweb-edu", "hf_config": "sample-10BT"},
}
FINEWEB_EDU_CONFIGS = ("sample-10BT", "sample-100BT", "sample-350BT")
SOURCES = ("embedded", "openwebtext", "fineweb_edu", "local")

# File suffix -> datasets' packaged builder.
_SUFFIX_FORMAT = {
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
}
_BUILDER = {"text": "text", "jsonl": "json", "parquet": "parquet"}
_COMPRESSION = (".gz", ".bz2", ".xz", ".zst", ".lz4")
_SAMPLE_BY = ("document", "paragraph", "line")


def load_dataset(*args, **kwargs):
    """``datasets.load_dataset``, imported on first use (tests monkeypatch this name)."""
    import datasets

    return datasets.load_dataset(*args, **kwargs)


class Source:
    """Documents in a fixed order. ``describe()`` is what the manifest records about the source."""

    name: str

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError

    def batches(self, start: int = 0) -> Iterator[list[str]]:
        raise NotImplementedError


@dataclass
class ListSource(Source):
    """Documents held in memory (the embedded corpus; benchmarks and tests)."""

    docs: list[str]
    info: dict[str, Any] = field(default_factory=dict)
    name: str = "list"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, **self.info}

    def batches(self, start: int = 0) -> Iterator[list[str]]:
        for i in range(start, len(self.docs), BATCH_DOCS):
            yield self.docs[i : i + BATCH_DOCS]


def embedded_source(cfg: DataConfig) -> ListSource:
    from mars.data.embedded import corpus_fingerprint, embedded_documents, python_version

    docs = embedded_documents(cfg.seed)
    info = {
        "python": python_version(),
        "seed": cfg.seed,
        "documents": len(docs),
        "corpus_sha256": corpus_fingerprint(docs),
    }
    return ListSource(docs, info, name="embedded")


def _text_column(batch: dict[str, list], text_field: str, where: str) -> list[str]:
    if text_field not in batch:
        raise SourceError(
            f"{where} has no field {text_field!r} (fields: {sorted(batch)}). "
            f"Set data.text_field to the field that holds the text."
        )
    texts = batch[text_field]
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise SourceError(
                f"{where}: a record has {text_field!r} = {text!r} ({type(text).__name__}), "
                f"expected a string. "
                f"Set data.text_field to a text field or drop such records (record {i} of a batch)."
            )
    return texts


@dataclass
class HFSource(Source):
    """A Hugging Face Hub dataset, downloaded (datasets' cache) or streamed (``data.streaming``)."""

    name: str
    hf_path: str
    hf_config: str | None
    split: str
    streaming: bool
    revision: str | None
    text_field: str

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hf_path": self.hf_path,
            "hf_config": self.hf_config,
            "split": self.split,
            "revision": self.revision,
            "text_field": self.text_field,
        }

    def _load(self):
        kwargs = {"split": self.split, "streaming": self.streaming}
        if self.revision:
            kwargs["revision"] = self.revision
        try:
            return load_dataset(self.hf_path, self.hf_config, **kwargs)
        except ConnectionError as e:
            raise SourceError(
                f"cannot reach Hugging Face dataset {self.hf_path!r} ({e}). Check the network (and that "
                f"HF_HUB_OFFLINE / HF_DATASETS_OFFLINE are unset), or use files you have: data=local"
            ) from e
        except RuntimeError as e:
            if "scripts are no longer supported" in str(e):
                raise SourceError(
                    f"Hugging Face dataset {self.hf_path!r} still ships a loading script, which datasets "
                    f"no longer runs. Use its parquet export: data.hf_revision=refs/convert/parquet"
                ) from e
            raise

    def batches(self, start: int = 0) -> Iterator[list[str]]:
        ds = self._load()  # now, not on first iteration: a bad name or no network fails before any work
        if start:
            ds = ds.skip(start)
        where = f"Hugging Face dataset {self.hf_path!r} ({self.hf_config or 'default'}/{self.split})"
        return (_text_column(batch, self.text_field, where) for batch in ds.iter(batch_size=BATCH_DOCS))


def resolve_paths(patterns: list[str]) -> list[Path]:
    """Files named by ``patterns`` (paths or globs, ``**`` allowed), in the given order, each glob sorted."""
    if not patterns:
        raise SourceError(
            "data.paths is empty: the local source needs files, e.g. data.paths=[my_corpus/*.jsonl]"
        )
    files: list[Path] = []
    for pattern in patterns:
        pattern = os.path.expanduser(str(pattern))
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise SourceError(f"data.paths pattern {pattern!r} matches no files")
            files.extend(Path(m) for m in matches)
        elif os.path.isfile(pattern):
            files.append(Path(pattern))
        else:
            raise SourceError(f"data.paths: file {pattern!r} does not exist")
    seen: set[Path] = set()
    unique = [f for f in files if not (f.resolve() in seen or seen.add(f.resolve()))]
    return unique


def infer_format(path: Path) -> str:
    name = path.name.lower()
    for ext in _COMPRESSION:
        if name.endswith(ext):
            name = name[: -len(ext)]
    fmt = _SUFFIX_FORMAT.get(Path(name).suffix)
    if fmt is None:
        raise SourceError(
            f"{path}: cannot tell the format from the suffix {Path(name).suffix!r}; "
            f"set data.format to one of text, jsonl, parquet"
        )
    return fmt


def _first_json_record(path: Path) -> dict | None:
    import fsspec

    with fsspec.open(str(path), "rt", compression="infer", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SourceError(f"{path}: the first record is not valid JSON ({e})") from e
                if not isinstance(record, dict):
                    raise SourceError(
                        f"{path}: records must be JSON objects, the first one is {type(record).__name__}"
                    )
                return record
    return None


@dataclass
class LocalSource(Source):
    """Local text / jsonl / parquet files, read one file after another in the order of data.paths."""

    patterns: list[str]
    files: list[Path]
    format: str
    text_field: str
    sample_by: str
    name: str = "local"

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "paths": list(self.patterns),
            "files": [str(f) for f in self.files],
            "format": self.format,
            "text_field": self.text_field,
            **({"sample_by": self.sample_by} if self.format == "text" else {}),
        }

    def check(self) -> None:
        """Fail before any work when a file lacks the text field (first record / parquet schema)."""
        for path in self.files:
            if self.format == "jsonl":
                record = _first_json_record(path)
                if record is not None and self.text_field not in record:
                    raise SourceError(
                        f"{path}: records have no field {self.text_field!r} (fields: {sorted(record)}). "
                        f"Set data.text_field to the field that holds the text."
                    )
            elif self.format == "parquet":
                import pyarrow.parquet as pq

                try:
                    names = pq.read_schema(path).names
                except Exception as e:
                    raise SourceError(f"{path}: not a readable parquet file ({e})") from e
                if self.text_field not in names:
                    raise SourceError(
                        f"{path}: parquet columns {names} do not include {self.text_field!r}. "
                        f"Set data.text_field to the column that holds the text."
                    )

    def _file_dataset(self, path: Path):
        kwargs = {"sample_by": self.sample_by} if self.format == "text" else {}
        return load_dataset(
            _BUILDER[self.format], data_files=[str(path)], split="train", streaming=True, **kwargs
        )

    def batches(self, start: int = 0) -> Iterator[list[str]]:
        index = 0  # global index of the next document
        for path in self.files:
            for batch in self._file_dataset(path).iter(batch_size=BATCH_DOCS):
                texts = _text_column(batch, self.text_field, str(path))
                if index + len(texts) > start:
                    yield texts[max(0, start - index) :]
                index += len(texts)


def get_source(cfg: DataConfig) -> Source:
    """The document source ``cfg.name`` names, checked before any work is done."""
    name = cfg.name
    if name == "embedded":
        return embedded_source(cfg)
    if name in HF_DEFAULTS:
        defaults = HF_DEFAULTS[name]
        hf_config = cfg.hf_config or defaults["hf_config"]
        if name == "fineweb_edu" and hf_config not in FINEWEB_EDU_CONFIGS:
            raise SourceError(
                f"data.hf_config={hf_config!r} is not a FineWeb-Edu sample; "
                f"choose one of {', '.join(FINEWEB_EDU_CONFIGS)}"
            )
        return HFSource(
            name=name,
            hf_path=cfg.hf_path or defaults["hf_path"],
            hf_config=hf_config,
            split=cfg.hf_split,
            streaming=cfg.streaming,
            revision=cfg.hf_revision,
            text_field=cfg.text_field,
        )
    if name == "local":
        files = resolve_paths(list(cfg.paths))
        if cfg.format is not None:
            if cfg.format not in _BUILDER:
                raise SourceError(f"data.format={cfg.format!r} is not one of text, jsonl, parquet")
            fmt = cfg.format
        else:
            formats = {f: infer_format(f) for f in files}
            if len(set(formats.values())) > 1:
                listing = ", ".join(f"{f} ({fmt})" for f, fmt in formats.items())
                raise SourceError(
                    f"data.paths mixes formats: {listing}. Prepare each format into its own data.dir."
                )
            fmt = next(iter(formats.values()))
        if cfg.text_sample_by not in _SAMPLE_BY:
            raise SourceError(
                f"data.text_sample_by={cfg.text_sample_by!r} is not one of {', '.join(_SAMPLE_BY)}"
            )
        source = LocalSource(list(cfg.paths), files, fmt, cfg.text_field, cfg.text_sample_by)
        source.check()
        return source
    raise SourceError(
        f"data.name={name!r} is not a known source; "
        f"choose one of {', '.join(SOURCES)} (configs/data/NAME.yaml)"
    )
