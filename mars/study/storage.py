"""Where a study keeps its state: an optuna storage, plus lock files in the study dir.

The storage (default: SQLite, STUDY_DIR/study.db; any SQLAlchemy URL optuna's RDBStorage takes, e.g.
postgresql://user@host/db for drivers on several machines) holds one optuna study per arm and search
round (NAME/ARM/search0, search1, ...: a round widened by auto_extend is a new study), one per arm for
the finals (NAME/ARM/final), and NAME itself, whose user attrs hold the spec that created the study.

Several drivers may run one study at once (on one machine, or on machines that share the study dir):

* the ask lock (STUDY_DIR/.ask.lock, fcntl) serialises every decision about which trial runs next: a
  trial is asked, and marked with its driver's id, inside it; so two drivers never take one trial
  and never overspend a round's budget;
* each driver holds STUDY_DIR/.drivers/ID.lock for its lifetime; the kernel drops it when the process
  dies, however it dies. A RUNNING trial whose driver's lock is free was orphaned: the next driver
  that looks adopts it and reruns it in its own dir with train.resume=auto.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from mars.study.errors import StudyError

DB_FILE = "study.db"
ASK_LOCK = ".ask.lock"
DRIVERS = ".drivers"


def default_storage(study_dir: Path) -> str:
    return f"sqlite:///{Path(study_dir).absolute() / DB_FILE}"


def open_storage(url: str):
    """optuna's RDBStorage at `url`, or a StudyError naming study.storage and the fix."""
    import optuna
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StudyError(
            f"study.storage={url!r} is not a database URL (e.g. sqlite:////abs/path/study.db, "
            "postgresql://user@host/dbname)"
        ) from None
    kwargs: dict = {}
    if parsed.get_backend_name() == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise StudyError(
                f"study.storage={url!r}: an in-memory SQLite database dies with the driver; give a file "
                "(sqlite:////abs/path/study.db) or leave study.storage unset"
            )
        path = Path(parsed.database)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a"):
                pass
        except OSError as e:
            raise StudyError(
                f"study.storage={url!r}: cannot write {path} ({e.strerror or e}); choose another"
            ) from None
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 120}}  # several drivers wait for the file lock
    try:
        storage = optuna.storages.RDBStorage(url, **kwargs)
        if parsed.get_backend_name() == "sqlite":
            _fast_sqlite(storage.engine)
        return storage
    except NoSuchModuleError:
        raise StudyError(
            f"study.storage={url!r}: SQLAlchemy knows no database {parsed.get_backend_name()!r}; use "
            "sqlite:///..., postgresql://..., mysql://..."
        ) from None
    except ModuleNotFoundError as e:
        raise StudyError(
            f"study.storage={url!r}: its database driver is not installed ({e.name}); install it "
            "(e.g. pip install psycopg2-binary for postgresql)"
        ) from None
    except (SQLAlchemyError, OSError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StudyError(
            f"study.storage={url!r}: cannot open it ({first}); check the URL and the server"
        ) from None


def _fast_sqlite(engine) -> None:
    """Write-ahead logging with synchronous=NORMAL: a commit no longer waits for two fsyncs (the study
    writes a few rows per trial), and a process killed at any point leaves the database whole (only a
    power loss can drop the last commits; their trials then run again, in their own dirs)."""
    from sqlalchemy import event

    def on_connect(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(engine, "connect", on_connect)
    engine.dispose()  # connections made before the listener are closed
    with engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA journal_mode=WAL")


# ----------------------------------------------------------------------------- locks


@contextmanager
def held(path: Path, poll_s: float = 0.05):
    """Hold an exclusive fcntl lock on `path` (created if missing) for the block, waiting for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(poll_s)
        yield
    finally:
        os.close(fd)


def is_locked(path: Path) -> bool:
    """Whether a live process holds the fcntl lock of `path` (False when the file does not exist)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class DriverLock:
    """This driver's id and its lifetime lock (STUDY_DIR/.drivers/ID.lock)."""

    def __init__(self, study_dir: Path):
        self.dir = Path(study_dir) / DRIVERS
        self.id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.dir / f"{self.id}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            (self.dir / f"{self.id}.lock").unlink(missing_ok=True)

    def alive(self, driver_id: str | None) -> bool:
        """Whether the driver with this id still runs (this one always does)."""
        if driver_id == self.id:
            return True
        return bool(driver_id) and is_locked(self.dir / f"{driver_id}.lock")
