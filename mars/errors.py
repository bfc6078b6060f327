"""The errors a user can act on: one small hierarchy for the whole harness.

Every message is one line naming the key, file, run or trial at fault and the fix. The entry points
(train.py, python -m eval, scripts/*.py, mars-study) print it as ``error: MESSAGE``, never a traceback,
and exit with the status its class says (`status`; mars.entry.fail):

    UserError            1  what the command names cannot be used: a study dir, a trial, runs to analyse,
                            lm-eval tasks; the base of everything below
      ConfigError        2  the command line or config is wrong: an unknown key, option or group, a value
                            out of range, a plugin that cannot be loaded or registers a taken name; found
                            before anything is written
      DataError          1  a dataset that cannot be used: not prepared, a source without files, a tokenizer
                            unfit for shards
        ManifestError       a manifest or shard disagrees with the files it describes
          DamagedShardError   a shard is missing or its bytes changed: preparing again rebuilds it
        SourceChangedError  regenerating a recorded shard gave other bytes (the documents changed)
      CheckpointError    1  a checkpoint is missing, unreadable, corrupt, or cannot continue this run (or
                            the disk filled while writing one)
      RunDirBusyError    1  another live process holds the run dir (`holder` says which)

The subclasses below DataError exist because the data pipeline recovers from them (a corpus prepared on
first use is rebuilt); nothing catches a kind finer than this. A run that diverged
(mars.train.outcome.TrainingDivergedError) is a UserError too: exit 1, its line names the step and the
run's outcome.json. A command may exit 2 for a UserError found while it checks its arguments, before
anything runs (the study's and the evaluation's checks): its module docstring says so.
"""

from __future__ import annotations

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """Something the user can fix, said in one line (printed as ``error: ...``): exit status 1."""

    status = EXIT_FAILED


class ConfigError(UserError, ValueError):
    """The command line or the config is wrong; found before anything is written: exit status 2."""

    status = EXIT_USAGE


class DataError(UserError):
    """A dataset (its directory, sources, tokenizer, shards) that cannot be used."""


class ManifestError(DataError):
    """A manifest is missing, malformed, or disagrees with the files or the config it describes."""


class DamagedShardError(ManifestError):
    """A shard is missing or its bytes are not the recorded ones: the prepare command rebuilds it."""


class SourceChangedError(DataError):
    """Regenerating a recorded shard gave other bytes: the source documents changed since they were prepared.

    Raised instead of writing a different dataset under the old manifest (or progress record)."""


class CheckpointError(UserError):
    """A checkpoint is missing, unreadable, corrupt, or cannot continue this run; the message says why."""


class RunDirBusyError(UserError):
    """Another live process holds the run dir (`holder` describes it)."""

    def __init__(self, message: str, holder: str = ""):
        super().__init__(message)
        self.holder = holder
