"""The local source: text, jsonl or parquet files given by ``data.paths`` (files or globs), read here
file by file, in order (``data.name=local``).

The files are read here rather than by ``datasets``' packaged loaders so that errors can name the
line and a bad line can be skipped (mars.data.sources: bad documents); for valid files the documents
are the ones those loaders give (text: universal newlines, ``data.text_sample_by`` document |
paragraph | line; jsonl: blank lines ignored, a leading BOM dropped, a file that is one JSON array
read as its items; parquet: rows in order), which keeps datasets prepared before this reader
rebuildable. Compressed files (.gz, .bz2, .xz, .zst, .lz4) are read through their codec.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import io
import itertools
import json
import lzma
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from mars.checks import choice, reported_as
from mars.data.config import FORMATS, SAMPLE_BY, DataConfig
from mars.data.sources import BATCH_CHARS, BATCH_DOCS, Source, json_type, one_line
from mars.errors import DataError

_PARAGRAPH_CHUNK = 8 << 20  # characters read at a time when splitting a text file into paragraphs
_SUFFIX_FORMAT = {
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
}
# Compressed-file suffix -> (codec, the package that reads it when it is not in the standard library).
_COMPRESSION = {
    ".gz": ("gzip", None),
    ".gzip": ("gzip", None),
    ".bz2": ("bz2", None),
    ".xz": ("xz", None),
    ".zst": ("zstd", "zstandard"),
    ".zstd": ("zstd", "zstandard"),
    ".lz4": ("lz4", "lz4"),
}
# Leading bytes of files that are not text: named when such a file fails to decode.
_MAGIC = {
    b"\x1f\x8b": "gzip file (name it .gz)",
    b"BZh": "bzip2 file (name it .bz2)",
    b"\xfd7zXZ\x00": "xz file (name it .xz)",
    b"\x28\xb5\x2f\xfd": "zstd file (name it .zst)",
    b"\x04\x22\x4d\x18": "lz4 file (name it .lz4)",
    b"PK\x03\x04": "zip archive (extract it)",
    b"PAR1": "parquet file (name it .parquet)",
}
_BOM = b"\xef\xbb\xbf"


def resolve_paths(patterns: list[str]) -> list[Path]:
    """Files named by ``patterns`` (paths or globs, ``**`` allowed), in the given order, each glob sorted."""
    if not patterns:
        raise DataError(
            "data.paths is empty: the local source needs files, e.g. data.paths=[my_corpus/*.jsonl]"
        )
    files: list[Path] = []
    for pattern in patterns:
        pattern = os.path.expanduser(str(pattern))
        if glob.has_magic(pattern):
            matches = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not matches:
                raise DataError(f"data.paths pattern {pattern!r} matches no files")
            files.extend(Path(m) for m in matches)
        elif os.path.isfile(pattern):
            files.append(Path(pattern))
        else:
            raise DataError(f"data.paths: file {pattern!r} does not exist")
    seen: set[Path] = set()
    unique = [f for f in files if not (f.resolve() in seen or seen.add(f.resolve()))]
    return unique


def _compression_suffix(path: Path) -> str | None:
    suffix = path.suffix.lower()
    return suffix if suffix in _COMPRESSION else None


def infer_format(path: Path) -> str:
    name = path.name.lower()
    suffix = _compression_suffix(path)
    if suffix:
        name = name[: -len(suffix)]
    fmt = _SUFFIX_FORMAT.get(Path(name).suffix)
    if fmt is None:
        raise DataError(
            f"{path}: cannot tell the format from the suffix {Path(name).suffix!r}; "
            f"set data.format to one of text, jsonl, parquet"
        )
    return fmt


def open_binary(path: Path) -> IO[bytes]:
    """``path`` opened for reading bytes, decompressed by its suffix (.gz .bz2 .xz .zst .lz4)."""
    suffix = _compression_suffix(path)
    codec, package = _COMPRESSION[suffix] if suffix else (None, None)
    try:
        if codec is None:
            return open(path, "rb")
        if codec == "gzip":
            return gzip.open(path, "rb")
        if codec == "bz2":
            return bz2.open(path, "rb")
        if codec == "xz":
            return lzma.open(path, "rb")
        if codec == "zstd":
            import zstandard

            raw = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True)
            return io.BufferedReader(raw)
        import lz4.frame

        return lz4.frame.open(path, "rb")
    except ImportError as e:
        raise DataError(
            f"{path}: reading {suffix} files needs the {package} package: pip install {package}"
        ) from e
    except OSError as e:
        raise DataError(f"{path}: cannot be opened ({one_line(e)}); check that it is a readable file") from e


def _read_errors() -> tuple[type[BaseException], ...]:
    """What a damaged or mislabeled compressed file raises while it is read."""
    errors: list[type[BaseException]] = [OSError, EOFError, zlib.error, lzma.LZMAError]
    try:
        import zstandard

        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    return tuple(errors)


def _not_text(text: str, at_file_start: bool) -> tuple[int, str] | None:
    """(offset, problem) of the first thing in ``text`` that shows it is not UTF-8 text, or None.

    ``text`` was decoded with errors="surrogateescape", so each byte that is not UTF-8 is a lone
    surrogate U+DC80..U+DCFF (strict UTF-8 decoding never yields one). A NUL is valid UTF-8 but does
    not occur in text: it marks binary data, or UTF-16 text.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        problem = f"not UTF-8 text (byte 0x{ord(text[e.start]) - 0xDC00:02x})"
        if at_file_start and e.start < 16:  # a compressed or binary format's header fails at once
            head = text[:8].encode("utf-8", "surrogateescape")
            kind = next((k for magic, k in _MAGIC.items() if head.startswith(magic)), None)
            if kind:
                problem += f", it looks like a {kind}"
        return e.start, problem
    nul = text.find("\x00")
    if nul >= 0:
        return nul, "holds a NUL byte: binary data or UTF-16 text, not UTF-8 text"
    return None


@dataclass(frozen=True)
class _Bad:
    """A jsonl item that is not a JSON object: what is wrong with it."""

    problem: str


_LINE_FIX = "fix the line"


@dataclass
class LocalSource(Source):
    """Local text / jsonl / parquet files, read one file after another in the order of data.paths."""

    patterns: list[str]
    files: list[Path]
    format: str
    text_field: str
    sample_by: str
    name: str = "local"
    skip_bad_documents: bool = False

    @classmethod
    def from_config(cls, cfg: DataConfig) -> LocalSource:
        files = resolve_paths(list(cfg.paths))
        if cfg.format is not None:
            with reported_as(DataError):
                choice("data.format", cfg.format, FORMATS)
            fmt = cfg.format
        else:
            formats = {f: infer_format(f) for f in files}
            if len(set(formats.values())) > 1:
                listing = ", ".join(f"{f} ({fmt})" for f, fmt in formats.items())
                raise DataError(
                    f"data.paths mixes formats: {listing}. Prepare each format into its own data.dir."
                )
            fmt = next(iter(formats.values()))
        with reported_as(DataError):
            choice("data.text_sample_by", cfg.text_sample_by, SAMPLE_BY)
        source = cls(
            list(cfg.paths),
            files,
            fmt,
            cfg.text_field,
            cfg.text_sample_by,
            name=cfg.name,
            skip_bad_documents=cfg.skip_bad_documents,
        )
        source.check()
        return source

    @classmethod
    def requested(cls, cfg: DataConfig) -> dict[str, Any]:
        out: dict[str, Any] = {
            "paths": [str(p) for p in cfg.paths],
            "format": cfg.format,
            "text_field": cfg.text_field,
        }
        if cfg.format in (None, "text"):
            out["sample_by"] = cfg.text_sample_by
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "paths": list(self.patterns),
            "files": [str(f) for f in self.files],
            "format": self.format,
            "text_field": self.text_field,
            **({"sample_by": self.sample_by} if self.format == "text" else {}),
        }

    # ------------------------------------------------------------------ checks before any work

    def check(self) -> None:
        """Fail before any work on a file that cannot be opened or lacks the text field."""
        for path in self.files:
            if self.format == "jsonl":
                self._check_jsonl(path)
            elif self.format == "parquet":
                self._check_parquet(path)
            else:
                open_binary(path).close()

    def _check_jsonl(self, path: Path, records: int = 100) -> None:
        """The first ``records`` JSON objects of ``path``: none holding the text field is a config error."""
        first: dict | None = None
        seen = 0
        try:
            for index, where, item in self._jsonl_items(path, 0, 0):
                if isinstance(item, _Bad):
                    if not self.skip_bad_documents:
                        self.bad_document(index, where, item.problem, _LINE_FIX)
                    continue
                if self.text_field in item:
                    return
                first = item if first is None else first
                seen += 1
                if seen == records:
                    break
        except _read_errors() as e:
            raise self._unreadable(path, e) from e
        if first is not None:
            raise DataError(
                f"{path}: records have no field {self.text_field!r} (fields: {sorted(first)}). "
                f"Set data.text_field to the field that holds the text."
            )

    def _parquet_file(self, path: Path):
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path)
        except Exception as e:  # pyarrow reports a damaged footer in several exception types
            raise DataError(
                f"{path}: not a readable parquet file ({one_line(e)}); "
                f"re-create it or remove it from data.paths"
            ) from e

    def _check_parquet(self, path: Path) -> None:
        import pyarrow as pa

        schema = self._parquet_file(path).schema_arrow
        names = schema.names
        if self.text_field not in names:
            raise DataError(
                f"{path}: parquet columns {names} do not include {self.text_field!r}. "
                f"Set data.text_field to the column that holds the text."
            )
        kind = schema.field(self.text_field).type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or str(kind) == "string_view"):
            raise DataError(
                f"{path}: parquet column {self.text_field!r} holds {kind}, not text. "
                f"Set data.text_field to the column that holds the text."
            )

    def _unreadable(self, path: Path, error: BaseException) -> DataError:
        return DataError(
            f"{path}: cannot be read ({type(error).__name__}: {one_line(error)}): it is damaged or not what "
            f"its suffix says; re-create it or remove it from data.paths"
        )

    # ------------------------------------------------------------------ reading

    def batches(self, start: int = 0) -> Iterator[list[str]]:
        read: Callable[[Path, int, int], Iterator[str | None]] = {
            "text": self._text_documents,
            "jsonl": self._jsonl_documents,
            "parquet": self._parquet_documents,
        }[self.format]
        batch: list[str] = []
        chars = index = 0
        errors = _read_errors()
        for path in self.files:
            try:
                for doc in read(path, index, start):
                    index += 1
                    if doc is None:
                        continue
                    batch.append(doc)
                    chars += len(doc)
                    if len(batch) == BATCH_DOCS or chars >= BATCH_CHARS:
                        yield batch
                        batch, chars = [], 0
            except errors as e:
                raise self._unreadable(path, e) from e
        if batch:
            yield batch

    # Each reader yields one item per document of ``path``, whose first document has index ``first``:
    # None for a document before ``start`` (counted, not read when that can be avoided), else its text.

    def _text(self, text: str, index: int, path: Path, line: int) -> str:
        bad = _not_text(text, at_file_start=line == 1)
        if bad is None:
            return text
        offset, problem = bad
        line += text.count("\n", 0, offset)
        return self.bad_document(
            index,
            f"{path} line {line}",
            problem,
            "convert it to UTF-8 text or remove the file from data.paths",
        )

    def _open_text(self, path: Path) -> io.TextIOWrapper:
        # Universal newlines, as datasets' text loader reads: "\r\n" and "\r" become "\n".
        return io.TextIOWrapper(open_binary(path), encoding="utf-8", errors="surrogateescape", newline=None)

    def _text_documents(self, path: Path, first: int, start: int) -> Iterator[str | None]:
        if self.sample_by == "document":
            if first < start:
                yield None
                return
            with self._open_text(path) as f:
                text = f.read()
            yield self._text(text, first, path, 1)
            return
        with self._open_text(path) as f:
            if self.sample_by == "line":
                for number, line in enumerate(f, 1):
                    index = first + number - 1
                    yield None if index < start else self._text(line.removesuffix("\n"), index, path, number)
                return
            # paragraph: the text split at "\n\n", empty pieces dropped; read in chunks that end at a line end
            index, line, rest = first, 1, ""
            while chunk := f.read(_PARAGRAPH_CHUNK):
                pieces = (rest + chunk + f.readline()).split("\n\n")
                for piece in pieces[:-1]:
                    if piece:
                        yield None if index < start else self._text(piece, index, path, line)
                        index += 1
                    line += piece.count("\n") + 2
                rest = pieces[-1]
            if rest:
                yield None if index < start else self._text(rest, index, path, line)

    def _jsonl_items(self, path: Path, first: int, start: int) -> Iterator[tuple[int, str, Any]]:
        """(index, where, item) per record of ``path``: a JSON value, a _Bad, or None before ``start``.

        One record per non-blank line, or per item when the whole file is one JSON array.
        """
        with open_binary(path) as f:
            head = f.readline()
            if head.startswith(_BOM):
                head = head[len(_BOM) :]
            if head.startswith(b"["):
                yield from self._json_array_items(path, head + f.read(), first, start)
                return
            index = first
            for number, raw in enumerate(itertools.chain((head,), f), 1):
                if not raw or raw.isspace():
                    continue
                where = f"{path} line {number}"
                if index < start:
                    yield index, where, None
                else:
                    yield index, where, _parse_json_line(raw)
                index += 1

    def _json_array_items(
        self, path: Path, data: bytes, first: int, start: int
    ) -> Iterator[tuple[int, str, Any]]:
        try:
            items = json.loads(data.decode("utf-8"))
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise DataError(
                f"{path} line {line}: not UTF-8 (byte 0x{data[e.start]:02x}); "
                f"convert the file to UTF-8 or remove it from data.paths"
            ) from e
        except json.JSONDecodeError as e:
            raise DataError(
                f"{path} line {e.lineno}: not valid JSON ({_json_message(e)} at column {e.colno}); the file "
                f"starts with '[' so it is read as one JSON array: fix it, or write one JSON object per line"
            ) from e
        if not isinstance(items, list):
            raise DataError(f"{path}: holds {json_type(items)} after '[', expected a JSON array of objects")
        for i, item in enumerate(items):
            if isinstance(item, str):  # datasets reads an array of strings as records {"text": item}
                item = {"text": item}
            elif not isinstance(item, dict):
                item = _Bad(f"{json_type(item)}, not a JSON object")
            index = first + i
            yield index, f"{path} item {i}", None if index < start else item

    def _jsonl_documents(self, path: Path, first: int, start: int) -> Iterator[str | None]:
        field_name = self.text_field
        for index, where, item in self._jsonl_items(path, first, start):
            if item is None:
                yield None
            elif isinstance(item, _Bad):
                yield self.bad_document(index, where, item.problem, _LINE_FIX)
            elif isinstance(text := item.get(field_name), str):
                yield text
            elif field_name not in item:
                fields = sorted(item)
                listing = ", ".join(map(repr, fields[:8])) + (", ..." if len(fields) > 8 else "")
                yield self.bad_document(
                    index,
                    where,
                    f"has no field {field_name!r} (fields: {listing})",
                    f"{_LINE_FIX} (or set data.text_field)",
                )
            else:
                yield self.bad_document(
                    index, where, f"{field_name!r} is {json_type(text)}, not a string", _LINE_FIX
                )

    def _parquet_documents(self, path: Path, first: int, start: int) -> Iterator[str | None]:
        import pyarrow as pa

        pf = self._parquet_file(path)
        index = first
        for group in range(pf.num_row_groups):
            rows = pf.metadata.row_group(group).num_rows
            if index + rows <= start:  # a whole row group before the resume point: counted, not read
                yield from itertools.repeat(None, rows)
                index += rows
                continue
            row = index - first
            try:
                for batch in pf.iter_batches(
                    batch_size=BATCH_DOCS, row_groups=[group], columns=[self.text_field]
                ):
                    for value in batch.column(0).to_pylist():
                        if index < start:
                            yield None
                        elif isinstance(value, str):
                            yield value
                        else:
                            yield self.bad_document(
                                index,
                                f"{path} row {row}",
                                f"{self.text_field!r} is {json_type(value)}, not a string",
                                "fix the row",
                            )
                        index += 1
                        row += 1
            except (OSError, pa.ArrowException) as e:
                raise DataError(
                    f"{path}: row group {group} cannot be read ({one_line(e)}); "
                    f"re-create the file or remove it from data.paths"
                ) from e


def _json_message(error: json.JSONDecodeError) -> str:
    """The decoder's complaint without its own dangling position words ("Invalid control character at")."""
    return error.msg.removesuffix(" at")


def _parse_json_line(raw: bytes) -> Any:
    """A jsonl line's record (a dict), or a _Bad saying why it is not one."""
    try:
        # without its line break, a line cut short inside a string is "unterminated", not "control character"
        line = raw.rstrip(b"\r\n").decode("utf-8")
    except UnicodeDecodeError as e:
        return _Bad(f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})")
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return _Bad(f"not valid JSON ({_json_message(e)} at column {e.colno})")
    if not isinstance(record, dict):
        return _Bad(f"{json_type(record)}, not a JSON object")
    return record
