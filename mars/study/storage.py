"""Where a study keeps its state, and how several drivers share it: the optuna storage, nothing else.

The storage (default: SQLite, STUDY_DIR/study.db; any SQLAlchemy URL optuna's RDBStorage takes, e.g.
postgresql://user@host/db for drivers on several machines) holds one optuna study per arm and search
round (NAME/ARM/search0, search1, ...: a round widened by auto_extend is a new study), one per arm for
the finals (NAME/ARM/final), and NAME itself, whose user attrs hold the spec that created the study.

Several drivers may run one study at once (threads, processes, machines). They coordinate through the
storage alone, never through lock files in the study dir (which network filesystems do not reliably
honour), in two tables of their own next to optuna's:

* mars_study_drivers: a row per live driver (its id, host and pid) with a heartbeat in the database
  server's clock, renewed every HEARTBEAT_S by a thread of the driver and deleted when it stops. A
  driver is alive while its row exists, its heartbeat is younger than STALE_S and, on this host, its
  process exists (so a driver killed here is known dead at once; one on another machine after
  STALE_S). A RUNNING trial whose driver is not alive was orphaned: the next driver that looks
  adopts it and reruns it in its own dir with train.resume=auto.
* mars_study_locks: the study's ask lock, one row whose holder is set by one atomic conditional
  UPDATE (from nobody, or from a driver that is not alive, to this one: the database's row lock
  decides between drivers that try at once). Every decision about which trial runs next is taken
  under it (a trial is asked, and marked with its driver's id, inside it), so two drivers never take
  one trial and never overspend a round's budget.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from mars.errors import UserError

DB_FILE = "study.db"
HEARTBEAT_S = 5.0  # a driver renews its heartbeat this often
STALE_S = 60.0  # a heartbeat this old (server clock) means the driver is gone
LOCK_POLL_S = 0.05
CONNECT_TIMEOUT_S = 10  # a server that does not answer: one line within seconds, not a hang
# the package to install, and the URL scheme that uses it, for a database whose driver is missing
DRIVERS = {
    "psycopg": ("postgresql", "pip install 'mars-harness[postgres]' (psycopg 3)"),
    "psycopg2": ("postgresql+psycopg2", "pip install psycopg2-binary, or use postgresql:// with psycopg 3"),
    "MySQLdb": ("mysql", "pip install mysqlclient, or use mysql+pymysql:// with pip install pymysql"),
    "pymysql": ("mysql+pymysql", "pip install pymysql"),
}


def default_storage(study_dir: Path) -> str:
    return f"sqlite:///{Path(study_dir).absolute() / DB_FILE}"


def shown(url: str) -> str:
    """The URL as messages print it: its password masked."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def open_storage(url: str, create: bool = True):
    """optuna's RDBStorage at `url` with the tables of this module, or a UserError naming study.storage
    (its password masked) and the fix: a URL that is no database URL, a driver that is not installed (the
    package named), a server that cannot be reached (the address), a refused login. create=False: a
    SQLite file that does not exist yet is not made (an empty in-memory storage stands for it, after its
    directory was found writable), so checks and a dry run leave nothing behind."""
    import optuna
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UserError(
            f"study.storage={url!r} is not a database URL (e.g. sqlite:////abs/path/study.db, "
            "postgresql://user@host/dbname)"
        ) from None
    where = f"study.storage={shown(url)}"
    backend = parsed.get_backend_name()
    kwargs: dict = {}
    if backend == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise UserError(
                f"{where}: an in-memory SQLite database dies with the driver; give a file "
                "(sqlite:////abs/path/study.db) or leave study.storage unset"
            )
        path = Path(parsed.database)
        try:
            if not create and not path.exists():
                from mars.files import nearest_existing, try_create_dir_in

                try_create_dir_in(nearest_existing(path.parent.absolute()))
                return optuna.storages.InMemoryStorage()
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a"):
                pass
        except OSError as e:
            raise UserError(f"{where}: cannot write {path} ({e.strerror or e}); choose another") from None
        kwargs["engine_kwargs"] = {"connect_args": {"timeout": 120}}  # several drivers wait for the file lock
    elif backend == "postgresql" and "connect_timeout" not in parsed.query:
        kwargs["engine_kwargs"] = {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
    elif backend == "mysql" and "connect_timeout" not in parsed.query:
        kwargs["engine_kwargs"] = {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
    try:
        storage = _rdb_storage(url, kwargs)
        if backend == "sqlite":
            _fast_sqlite(storage.engine)
        _create_tables(storage.engine)
        return storage
    except NoSuchModuleError:
        raise UserError(
            f"{where}: SQLAlchemy knows no database {backend!r}; use sqlite:///..., postgresql://..., "
            "mysql://..."
        ) from None
    except ImportError as e:  # optuna wraps the driver's ModuleNotFoundError
        raise UserError(_missing_driver(where, e)) from None
    except Exception as e:  # noqa: BLE001 - a database error of any driver: one line, never a traceback
        raise UserError(_cannot_open(where, parsed, e)) from None


def _rdb_storage(url: str, kwargs: dict):
    """RDBStorage(url), tried again when another driver creating the same tables at the same moment made
    this one's creation fail (optuna creates its tables and version rows without a lock)."""
    import optuna

    return _again_if_raced(lambda: optuna.storages.RDBStorage(url, **kwargs))


def _again_if_raced(make, tries: int = 5):
    """make(), tried again after an error that another process creating the same tables causes."""
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    for attempt in range(tries):
        try:
            return make()
        except (IntegrityError, ProgrammingError, OperationalError) as e:
            raced = any(w in str(e).lower() for w in ("already exists", "duplicate", "locked", "unique"))
            if not raced or attempt == tries - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _missing_driver(where: str, e: ImportError) -> str:
    cause = e.__cause__ if isinstance(e.__cause__, ImportError) else e
    name = getattr(cause, "name", None) or str(cause)
    scheme, install = DRIVERS.get(name, (None, f"install the Python package {name}"))
    return f"{where}: the database driver {name} is not installed: {install}" + (
        f" (it serves {scheme}:// URLs)" if scheme else ""
    )


def _cannot_open(where: str, parsed, e: BaseException) -> str:
    """One line for a database that refused or could not be reached (no password in it)."""
    text = " ".join(str(getattr(e, "orig", None) or e).split())
    if parsed.password:
        text = text.replace(str(parsed.password), "***")
    low = text.lower()
    address = f"{parsed.host or 'localhost'}{f':{parsed.port}' if parsed.port else ''}"
    if "password authentication failed" in low or "access denied" in low:
        return (
            f"{where}: the server at {address} refused user {parsed.username!r} (wrong password or "
            "unknown user); check the user and password in the URL"
        )
    if "does not exist" in low and "database" in low:
        return f"{where}: the server at {address} has no database {parsed.database!r}; create it (createdb)"
    unreachable = ("could not translate host name", "name or service not known", "connection refused",
                   "timeout expired", "timed out", "no route to host", "network is unreachable",
                   "can't connect", "could not connect", "connection failed")  # fmt: skip
    if any(u in low for u in unreachable):
        return (
            f"{where}: cannot reach the database server at {address} ({_first(text)}); start it, or check "
            "the host and port in the URL"
        )
    return f"{where}: cannot open it ({_first(text)}); check the URL and the server"


def _first(text: str, limit: int = 200) -> str:
    text = text.split("(Background on this error")[0].strip().rstrip(".")
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


# ----------------------------------------------------------------------------- the drivers' tables


def _tables():
    from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table

    meta = MetaData()
    drivers = Table(
        "mars_study_drivers",
        meta,
        Column("study", String(255), primary_key=True),
        Column("driver", String(255), primary_key=True),
        Column("host", String(255), nullable=False),
        Column("pid", Integer, nullable=False),
        Column("beat", DateTime(timezone=True), nullable=False),
    )
    locks = Table(
        "mars_study_locks",
        meta,
        Column("study", String(255), primary_key=True),
        Column("holder", String(255), nullable=True),
    )
    return meta, drivers, locks


_META, DRIVER_ROWS, LOCK_ROWS = _tables()


def _create_tables(engine) -> None:
    """Create the two tables if missing (another driver creating them at the same moment: tried again)."""
    _again_if_raced(lambda: _META.create_all(engine, checkfirst=True))


def _pid_running(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, OverflowError):
        return True
    return True


class DriverLock:
    """This driver's id, its heartbeat row, and the study's ask lock, all in the storage."""

    def __init__(self):
        self.host = socket.gethostname()
        self.id = f"{self.host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.engine = None
        self.study = ""
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def acquire(self, storage, study: str) -> None:
        """Register this driver in the storage of `study` (dropping the rows of this machine's drivers
        that were killed) and start its heartbeat."""
        from sqlalchemy import delete, func, insert, select
        from sqlalchemy.exc import IntegrityError

        self.engine, self.study = storage.engine, study
        with self.engine.begin() as c:
            here = c.execute(
                select(DRIVER_ROWS.c.driver, DRIVER_ROWS.c.pid).where(
                    DRIVER_ROWS.c.study == study, DRIVER_ROWS.c.host == self.host
                )
            ).all()
            gone = [d for d, pid in here if not _pid_running(pid)]  # killed drivers of this machine
            if gone:
                c.execute(
                    delete(DRIVER_ROWS).where(DRIVER_ROWS.c.study == study, DRIVER_ROWS.c.driver.in_(gone))
                )
            c.execute(
                insert(DRIVER_ROWS).values(
                    study=study, driver=self.id, host=self.host, pid=os.getpid(), beat=func.now()
                )
            )
        try:
            with self.engine.begin() as c:
                c.execute(insert(LOCK_ROWS).values(study=study, holder=None))
        except IntegrityError:
            pass  # another driver made it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {self.id}", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        from sqlalchemy import func, update
        from sqlalchemy.exc import SQLAlchemyError

        while not self._stop.wait(HEARTBEAT_S):
            try:
                with self.engine.begin() as c:
                    c.execute(update(DRIVER_ROWS).where(*self._mine()).values(beat=func.now()))
            except SQLAlchemyError:
                pass  # the server is away for a moment: the next beat tries again

    def _mine(self):
        return DRIVER_ROWS.c.study == self.study, DRIVER_ROWS.c.driver == self.id

    def release(self) -> None:
        """Stop the heartbeat and remove this driver's row (its RUNNING trials become orphans)."""
        from sqlalchemy import delete, update
        from sqlalchemy.exc import SQLAlchemyError

        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        try:
            with self.engine.begin() as c:
                c.execute(
                    update(LOCK_ROWS)
                    .where(LOCK_ROWS.c.study == self.study, LOCK_ROWS.c.holder == self.id)
                    .values(holder=None)
                )
                c.execute(delete(DRIVER_ROWS).where(*self._mine()))
        except SQLAlchemyError:
            pass  # its heartbeat stops: the others find it gone after STALE_S

    def alive(self, driver_id: str | None) -> bool:
        """Whether the driver with this id still runs (this one always does)."""
        from sqlalchemy import func, select

        if driver_id == self.id:
            return True
        if not driver_id or self.engine is None:
            return False
        with self.engine.connect() as c:
            row = c.execute(
                select(DRIVER_ROWS.c.host, DRIVER_ROWS.c.pid, DRIVER_ROWS.c.beat, func.now()).where(
                    DRIVER_ROWS.c.study == self.study, DRIVER_ROWS.c.driver == driver_id
                )
            ).first()
        if row is None:
            return False
        host, pid, beat, now = row
        if host == self.host and not _pid_running(pid):
            return False
        return _age(now, beat) < STALE_S

    @contextmanager
    def ask(self):
        """Hold the study's ask lock for the block, waiting for it; a holder that is not alive loses it."""
        from sqlalchemy import or_, select, update

        table = LOCK_ROWS
        while True:
            with self.engine.begin() as c:
                free = or_(table.c.holder.is_(None), table.c.holder == self.id)
                taken = c.execute(
                    update(table).where(table.c.study == self.study, free).values(holder=self.id)
                ).rowcount
            if taken == 1:
                break
            with self.engine.connect() as c:
                holder = c.execute(select(table.c.holder).where(table.c.study == self.study)).scalar()
            if holder is not None and not self.alive(holder):
                with self.engine.begin() as c:
                    taken = c.execute(
                        update(table)
                        .where(table.c.study == self.study, table.c.holder == holder)
                        .values(holder=self.id)
                    ).rowcount
                if taken == 1:
                    break
            time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            with self.engine.begin() as c:
                c.execute(
                    update(table)
                    .where(table.c.study == self.study, table.c.holder == self.id)
                    .values(holder=None)
                )


def _age(now, beat) -> float:
    """Seconds between two readings of the server's clock (zone-aware from some servers, not others)."""
    if (now.tzinfo is None) != (beat.tzinfo is None):
        now, beat = now.replace(tzinfo=None), beat.replace(tzinfo=None)
    return (now - beat).total_seconds()
