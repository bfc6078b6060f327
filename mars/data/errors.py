"""Errors raised by the data pipeline. Each message names the file or config key at fault and what to do."""

from __future__ import annotations


class DataError(Exception):
    """Base class of every data-pipeline error."""


class DataNotPreparedError(DataError):
    """The dataset directory has no finished preparation; the message holds the command that makes one."""


class ManifestError(DataError):
    """A manifest is missing, malformed, or disagrees with the files or the config it describes."""


class ShardError(ManifestError):
    """A token shard disagrees with its manifest (size, dtype, checksum) or holds out-of-range token ids."""


class DamagedShardError(ShardError):
    """A shard is missing or its bytes are not the recorded ones: the prepare command rebuilds it."""


class SourceError(DataError):
    """A document source is misconfigured: unknown name, no files, a missing text field, unreadable input."""


class DataConfigError(SourceError):
    """A data.* value that cannot work (unknown name or choice, a size out of range): a command-line error."""


class SourceChangedError(SourceError):
    """Regenerating a recorded shard gave other bytes: the source documents changed since they were prepared.

    Raised instead of writing a different dataset under the old manifest (or progress record).
    """


class TokenizerError(DataError, ValueError):
    """data.tokenizer names nothing loadable, or a tokenizer unfit for shards (no end-of-text token)."""
