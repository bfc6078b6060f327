"""Document sources: each yields the documents of a dataset as batches of strings, in a fixed order.

A source is chosen by ``data.name`` through the registry (mars.data.registry), which registers the
built-ins:
    embedded     English prose shipped inside Python (mars.data.embedded), no network
    openwebtext  Hugging Face "Skylion007/openwebtext"
    fineweb_edu  Hugging Face "HuggingFaceFW/fineweb-edu" sample-10BT | sample-100BT | sample-350BT, streamed
    local        text, jsonl or parquet files given by paths or globs (mars.data.local)
and any unregistered name given with ``data.hf_path``: that Hugging Face dataset (HFSource).

Each Source class owns its identity: ``from_config`` builds and checks it from the data config,
``requested`` is what the manifest records about the request (compared on every later use),
``config_defaults`` the values a null data.hf_path / data.hf_config stands for, and
``prepared_on_first_use`` marks a corpus derived from the installation (the embedded one).

``Source.batches(start)`` yields lists of document texts beginning at document index ``start``, so
an interrupted preparation resumes without re-tokenizing what it already wrote.

Bad documents. A document that cannot be read -- a text file (or line, or paragraph) that is not
UTF-8 text, a jsonl line that is not a JSON object with a string text field, a parquet row whose
text is null -- stops the preparation with one line naming the file and line. With
``data.skip_bad_documents=true`` it is yielded as "" instead (no tokens, like a blank line) and
recorded in ``Source.skipped``. Either way it keeps its document index: indices count every
document of the stream, so the same index names the same document on every run and a resumed
preparation continues exactly where the interrupted one stopped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mars.data.config import DataConfig
from mars.errors import DataError

BATCH_DOCS = 512
BATCH_CHARS = 8 << 20  # a batch also ends here: whole-file documents can be large

SKIP_EXAMPLES = 10  # skipped documents listed by location (progress.json, the manifest)
STREAM_WINDOW = 1_000_000  # a streamed dataset's validation split is sampled from its first documents
_SKIP_HINT = "pass data.skip_bad_documents=true to skip bad documents"


def load_dataset(*args, **kwargs):
    """``datasets.load_dataset``, imported on first use (tests monkeypatch this name)."""
    import datasets

    return datasets.load_dataset(*args, **kwargs)


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


@dataclass(frozen=True)
class BadDocument:
    """A document that could not be read, skipped under ``data.skip_bad_documents=true``."""

    index: int  # its document index in the stream
    where: str  # e.g. "corpus/a.jsonl line 17"
    problem: str  # e.g. "not valid JSON (Expecting ',' delimiter at column 12)"

    def __str__(self) -> str:
        return f"{self.where}: {self.problem}"


class SkipLog:
    """The documents a source skipped: their indices as runs of consecutive ones, the first few in full.

    Memory stays small however many are skipped (a binary file read by line is one run of bad
    lines). The shard writer takes the count before each finished shard's end (``take_before``).
    """

    def __init__(self) -> None:
        self.runs: deque[list[int]] = deque()  # [first, last] document indices, in stream order
        self.first: list[BadDocument] = []  # the first SKIP_EXAMPLES in full

    def add(self, bad: BadDocument) -> None:
        if self.runs and self.runs[-1][1] == bad.index - 1:
            self.runs[-1][1] = bad.index
        else:
            self.runs.append([bad.index, bad.index])
        if len(self.first) < SKIP_EXAMPLES:
            self.first.append(bad)

    def clear(self) -> None:
        """Forget every skipped document (the sample rule's first pass reads the stream before the writer)."""
        self.runs.clear()
        self.first.clear()

    def take_before(self, document: int) -> int:
        """Forget the skipped documents before index ``document``; returns how many there were."""
        taken = 0
        while self.runs and self.runs[0][0] < document:
            first, last = self.runs[0]
            if last < document:
                self.runs.popleft()
                taken += last - first + 1
            else:
                self.runs[0][0] = document
                taken += document - first
        return taken


class Source:
    """Documents in a fixed order, and the identity of their kind of source.

    A subclass registered under a name (``mars.data.register_source``) is what ``data.name=NAME``
    selects. Per class: ``from_config(cfg)`` builds and checks the source from the data config before
    any work is done (raise DataError with one line naming the key); ``requested(cfg)`` is what the
    manifest records about the request besides its name, sizes and tokenizer: every key of it is
    compared when the prepared directory is used again, so it must hold exactly what chooses the
    documents. Per instance: ``batches(start)`` and ``describe()``, what was read (the manifest's
    "source": resolved files, a corpus checksum).
    """

    name: str
    skip_bad_documents: bool = False
    # The DataConfig values a null data.hf_path / data.hf_config stands for (the prepare command leaves
    # them out; the manifest records the value used).
    config_defaults: ClassVar[dict[str, Any]] = {}
    # A corpus derived from this installation (no download, seconds to build): prepared on first use,
    # rebuilt when the installation changed, and kept for every run that uses it: a config that asks
    # for other settings of it is refused with the data.dir of its own to use.
    prepared_on_first_use: ClassVar[bool] = False
    # requested() keys the installation decides, not the config (a difference means: rebuild).
    environment_keys: ClassVar[tuple[str, ...]] = ()
    # Documents that come in a seeded random order already: the validation split is the head of the
    # stream, and data.split_seed does not apply (mars.data.split).
    shuffled: ClassVar[bool] = False

    @property
    def split_window(self) -> int | None:
        """How many documents from the start of the stream the validation split is sampled from: None
        for all of them (the stream is then read twice, once to sample it and once to write the
        training split); a stream whose length is unknown until it is read may limit that first pass."""
        return None

    @classmethod
    def from_config(cls, cfg: DataConfig) -> Source:
        raise NotImplementedError(f"{cls.__qualname__}.from_config(cfg) builds the source from data.*")

    @classmethod
    def requested(cls, cfg: DataConfig) -> dict[str, Any]:
        """By default every data.* key that can choose documents (under the manifest's names)."""
        return {
            "hf_path": cfg.hf_path,
            "hf_config": cfg.hf_config,
            "split": cfg.hf_split,
            "revision": cfg.hf_revision,
            "paths": [str(p) for p in cfg.paths],
            "format": cfg.format,
            "text_field": cfg.text_field,
            "sample_by": cfg.text_sample_by,
            "seed": cfg.seed,
        }

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError

    def batches(self, start: int = 0) -> Iterator[list[str]]:
        raise NotImplementedError

    @property
    def skipped(self) -> SkipLog:
        """The bad documents skipped so far; the shard writer counts them as shards finish."""
        return self.__dict__.setdefault("_skipped", SkipLog())

    def bad_document(self, index: int, where: str, problem: str, fix: str) -> str:
        """Stop on a bad document (one line: where, what, ``fix``), or skip it: "" holds its place."""
        if not self.skip_bad_documents:
            raise DataError(f"{where}: {problem}; {fix}, or {_SKIP_HINT}")
        self.skipped.add(BadDocument(index, where, problem))
        return ""


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


class EmbeddedSource(ListSource):
    """The embedded corpus (mars.data.embedded): the same documents for the same Python version and seed."""

    prepared_on_first_use = True
    environment_keys = ("python",)
    shuffled = True  # with data.seed: its validation split, the head of the stream, is a seeded sample

    @classmethod
    def from_config(cls, cfg: DataConfig) -> EmbeddedSource:
        from mars.data import embedded

        docs = embedded.embedded_documents(cfg.seed)
        info = {
            "python": embedded.python_version(),
            "seed": cfg.seed,
            "documents": len(docs),
            "corpus_sha256": embedded.corpus_fingerprint(docs),
        }
        return cls(docs, info, name=cfg.name)

    @classmethod
    def requested(cls, cfg: DataConfig) -> dict[str, Any]:
        from mars.data import embedded

        return {"python": embedded.python_version(), "seed": cfg.seed}


def json_type(value: Any) -> str:
    """``value``'s type in JSON's words, for messages about records."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {dict: "an object", list: "an array", str: "a string", type(None): "null"}.get(
        type(value), type(value).__name__
    )


@dataclass
class HFSource(Source):
    """A Hugging Face dataset (data.hf_path: a Hub name, or a local directory of data files), downloaded
    into datasets' cache or streamed (``data.streaming``).

    Selected by its registered subclasses (openwebtext, fineweb_edu) and by any unregistered
    ``data.name`` given with ``data.hf_path`` (a configs/data/NAME.yaml naming a Hub dataset).
    """

    name: str
    hf_path: str
    hf_config: str | None
    split: str
    streaming: bool
    revision: str | None
    text_field: str
    skip_bad_documents: bool = False

    @classmethod
    def from_config(cls, cfg: DataConfig) -> HFSource:
        hf_path, hf_config = cls._hf_dataset(cfg)
        if not hf_path:
            raise DataError(
                f"data.name={cfg.name}: data.hf_path is not set; give the Hugging Face dataset, "
                "e.g. data.hf_path=OWNER/DATASET"
            )
        return cls(
            name=cfg.name,
            hf_path=hf_path,
            hf_config=hf_config,
            split=cfg.hf_split,
            streaming=cfg.streaming,
            revision=cfg.hf_revision,
            text_field=cfg.text_field,
            skip_bad_documents=cfg.skip_bad_documents,
        )

    @classmethod
    def _hf_dataset(cls, cfg: DataConfig) -> tuple[str | None, str | None]:
        """(hf_path, hf_config) that ``cfg`` asks for, a null value meaning the class's default."""
        defaults = cls.config_defaults
        return cfg.hf_path or defaults.get("hf_path"), cfg.hf_config or defaults.get("hf_config")

    @classmethod
    def requested(cls, cfg: DataConfig) -> dict[str, Any]:
        hf_path, hf_config = cls._hf_dataset(cfg)
        return {
            "hf_path": hf_path,
            "hf_config": hf_config,
            "split": cfg.hf_split,
            "revision": cfg.hf_revision,
            "text_field": cfg.text_field,
        }

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "hf_path": self.hf_path,
            "hf_config": self.hf_config,
            "split": self.split,
            "revision": self.revision,
            "text_field": self.text_field,
        }

    @property
    def split_window(self) -> int | None:
        """A streamed dataset has its validation split sampled from its first STREAM_WINDOW documents (which
        are streamed twice): its length is unknown until it is read."""
        return STREAM_WINDOW if self.streaming else None

    def _load(self):
        kwargs = {"split": self.split, "streaming": self.streaming}
        if self.revision:
            kwargs["revision"] = self.revision
        try:
            return load_dataset(self.hf_path, self.hf_config, **kwargs)
        except ConnectionError as e:
            raise DataError(
                f"cannot reach Hugging Face dataset {self.hf_path!r} ({e}). Check the network (and that "
                f"HF_HUB_OFFLINE / HF_DATASETS_OFFLINE are unset), or use files you have: data=local"
            ) from e
        except RuntimeError as e:
            if "scripts are no longer supported" in str(e):
                raise DataError(
                    f"Hugging Face dataset {self.hf_path!r} still ships a loading script, which datasets "
                    f"no longer runs. Use its parquet export: data.hf_revision=refs/convert/parquet"
                ) from e
            raise

    def _texts(self, batch: dict[str, list], first: int, where: str) -> list[str]:
        if self.text_field not in batch:
            raise DataError(
                f"{where} has no field {self.text_field!r} (fields: {sorted(batch)}). "
                f"Set data.text_field to the field that holds the text."
            )
        return [
            text
            if isinstance(text, str)
            else self.bad_document(
                first + i,
                f"{where} record {first + i}",
                f"{self.text_field!r} is {json_type(text)}, not a string",
                "set data.text_field to a text field",
            )
            for i, text in enumerate(batch[self.text_field])
        ]

    def batches(self, start: int = 0) -> Iterator[list[str]]:
        ds = self._load()  # now, not on first iteration: a bad name or no network fails before any work
        if start:
            ds = ds.skip(start)
        where = f"Hugging Face dataset {self.hf_path!r} ({self.hf_config or 'default'}/{self.split})"

        def generate() -> Iterator[list[str]]:
            index = start
            for batch in ds.iter(batch_size=BATCH_DOCS):
                texts = self._texts(batch, index, where)
                index += len(texts)
                yield texts

        return generate()


class OpenWebText(HFSource):
    """OpenWebText, the paper's GPT-2 corpus (~9B GPT-2 tokens)."""

    config_defaults = {"hf_path": "Skylion007/openwebtext", "hf_config": None}


class FineWebEdu(HFSource):
    """FineWeb-Edu, one of its samples (data.hf_config)."""

    config_defaults = {"hf_path": "HuggingFaceFW/fineweb-edu", "hf_config": "sample-10BT"}
    samples = ("sample-10BT", "sample-100BT", "sample-350BT")

    @classmethod
    def from_config(cls, cfg: DataConfig) -> HFSource:
        hf_config = cls._hf_dataset(cfg)[1]
        if hf_config not in cls.samples:
            raise DataError(
                f"data.hf_config={hf_config!r} is not a FineWeb-Edu sample; "
                f"choose one of {', '.join(cls.samples)}"
            )
        return super().from_config(cfg)
