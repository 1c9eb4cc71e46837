"""The database: SQLModel engine, SQLite pragmas, migrations, and read / write sessions.

SQLite in the data dir is the default, for one process; PostgreSQL (`--database-url
postgresql+psycopg://…`) is for several nodes. Both run the same queries and the same
Alembic revisions (app/migrations/).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import event, inspect, make_url, text
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Engine as SAEngine
from sqlmodel import Session, create_engine

from app import tables  # noqa: F401  (registers the tables)

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger("batchyard.db")

MIGRATIONS = Path(__file__).parent / "migrations"
#: The revision that is exactly 0.1.0's tables, which create_all made without Alembic.
LEGACY_REVISION = "0001"
LEGACY_TABLES = ("file", "batch", "request")
#: Key of the PostgreSQL advisory lock that lets one node at a time migrate.
MIGRATION_LOCK_KEY = 0x62617463  # "batc"
#: How long a SQLite write waits for the one before it.
SQLITE_BUSY_SECONDS = 30


class DatabaseError(Exception):
    """The database cannot be used as it is; the message says why and what to do."""


class Database:
    """One SQLAlchemy engine; `write()` sessions begin IMMEDIATE on SQLite.

    A deferred read-then-write transaction in SQLite fails at once with "database is
    locked" when another writer got in between; taking the write lock up front makes
    the writer wait instead. Writers in this process queue on a lock before they begin:
    SQLite's own busy handler waits by sleeping (up to 100 ms a try), so a writer that
    found the file locked slept on long after the lock was free, and under load the API's
    p99 was those sleeps (bench/README.md). On PostgreSQL a write is a plain READ
    COMMITTED transaction: rows that two nodes may change together are locked with
    FOR UPDATE (SQLite leaves the clause out; its one writer at a time needs none).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        self._sqlite_file = sqlite_file(url)
        if self._sqlite_file is not None:
            hold_sqlite_file(self._sqlite_file)
        connect_args = (
            {"check_same_thread": False, "timeout": SQLITE_BUSY_SECONDS} if self.is_sqlite else {}
        )
        # PostgreSQL: API threads, the runner and the dashboard each hold a connection briefly.
        # The pool keeps enough for 20 busy clients: a connection beyond pool_size is closed
        # when it is returned, so a burst would start a new server process per request
        # (bench/api_load.py, p99 under load: median 114 ms with 5 kept, 90 ms with 20; bench/README.md).
        # On SQLite too: a connection beyond the kept ones was opened (and its pragmas run)
        # again for every request of a burst. A ping only checks a server's connection.
        self.engine: SAEngine = create_engine(
            url,
            connect_args=connect_args,
            pool_pre_ping=not self.is_sqlite,
            pool_size=20,
            max_overflow=10,
        )
        # One process owns a SQLite file (hold_sqlite_file), so its writers can queue here
        # and each starts the moment the one before commits. Reentrant: a write opened
        # inside another in the same thread waits on SQLite as before.
        self._write_lock = threading.RLock() if self.is_sqlite else None
        if self.is_sqlite:
            self._install_sqlite_hooks()
        self._writer = self.engine.execution_options(batchyard_immediate=True)
        # PostgreSQL reads run in autocommit: at READ COMMITTED each statement sees its own
        # snapshot inside a transaction too, so BEGIN and ROLLBACK were two round trips a
        # request that changed nothing. SQLite keeps its transaction: there it is what makes
        # a read's statements one snapshot, and it costs no round trip.
        self._reader = (
            self.engine
            if self.is_sqlite
            else self.engine.execution_options(isolation_level="AUTOCOMMIT")
        )

    def _install_sqlite_hooks(self) -> None:
        @event.listens_for(self.engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy's "begin" event emit BEGIN itself (pysqlite's own is deferred).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_SECONDS * 1000}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(self.engine, "begin")
        def _on_begin(conn: Connection) -> None:
            immediate = conn.get_execution_options().get("batchyard_immediate")
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    def migrate(self) -> None:
        """Bring the schema to the newest revision; a new database gets every table.

        A database made by 0.1.0 (tables, no alembic_version) is stamped as revision
        0001 once its tables are found, then upgraded. On PostgreSQL an advisory lock
        lets one node migrate while the others starting beside it wait.
        """
        # Alembic says which plugins and DDL mode it set up on every start; this logs what
        # changed instead.
        logging.getLogger("alembic").setLevel(logging.WARNING)
        with self._writer.connect() as conn:
            if self.is_sqlite:
                # Alembic alters a SQLite table by copying it and dropping the old one; with
                # foreign keys on, that drop would cascade into the rows pointing at it.
                # The pragma does nothing inside a transaction, so it goes first.
                _driver_execute(conn, "PRAGMA foreign_keys=OFF")
            try:
                with conn.begin():
                    self._migrate(conn)
            finally:
                if self.is_sqlite:
                    _driver_execute(conn, "PRAGMA foreign_keys=ON")

    def _migrate(self, conn: Connection) -> None:
        from alembic import command

        if not self.is_sqlite:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        config = _alembic_config(conn)
        before = _current_revision(conn)
        if before is None:
            found = set(inspect(conn).get_table_names())
            if found & set(LEGACY_TABLES):
                missing = [t for t in LEGACY_TABLES if t not in found]
                if missing:
                    raise DatabaseError(
                        f"The database at {self.safe_url} has some of batchyard's tables "
                        f"but not {', '.join(missing)}, and no migration history; it was "
                        "not made by batchyard, so it is left as it is. Use an empty "
                        "database or one batchyard made."
                    )
                command.stamp(config, LEGACY_REVISION)
                log.info("database: 0.1.0's tables found, stamped %s", LEGACY_REVISION)
        command.upgrade(config, "head")
        after = _current_revision(conn)
        if after != before:
            log.info("database migrated from %s to %s", before or "nothing", after)

    def revision(self) -> str | None:
        """The schema's Alembic revision (None before the first migration)."""
        with self.engine.connect() as conn:
            return _current_revision(conn)

    @property
    def safe_url(self) -> str:
        """The URL without its password, for error messages and the worker's start-up line."""
        return make_url(self.url).render_as_string(hide_password=True)

    @contextmanager
    def exclusive(self, name: str) -> Iterator[bool]:
        """Whether this process may do the work called `name` alone, for the block.

        On PostgreSQL a session advisory lock, tried without waiting: one node gets True,
        the others False until the block ends (or the node dies, closing its connection).
        On SQLite always True: one process owns the file (hold_sqlite_file).
        """
        if self.is_sqlite:
            yield True
            return
        key = {"name": name}
        with self.engine.connect() as conn:
            got = bool(
                conn.execute(text("SELECT pg_try_advisory_lock(hashtext(:name))"), key).scalar()
            )
            conn.commit()  # the lock belongs to the session: no transaction stays open
            try:
                yield got
            finally:
                if got:
                    conn.execute(text("SELECT pg_advisory_unlock(hashtext(:name))"), key)
                    conn.commit()

    @contextmanager
    def snapshot(self) -> Iterator[Connection]:
        """A read inside one transaction: one snapshot for all its statements, and on
        PostgreSQL what a server-side cursor (`stream_results`) needs; `read()` runs in
        autocommit there."""
        with self.engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self._reader, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A short write transaction: committed on success, rolled back on error."""
        with (
            self._queued(),
            Session(self._writer, expire_on_commit=False) as session,
            session.begin(),
        ):
            yield session

    @contextmanager
    def _queued(self) -> Iterator[None]:
        """This process's turn to write: on SQLite after the write before it, at once on
        PostgreSQL (its rows are locked where they are changed)."""
        lock = self._write_lock
        if lock is None:
            yield
            return
        if not lock.acquire(timeout=SQLITE_BUSY_SECONDS):
            raise DatabaseError(
                f"No write to the database was possible for {SQLITE_BUSY_SECONDS} s: "
                "another write in this process held it all that time."
            )
        try:
            yield
        finally:
            lock.release()

    def close(self) -> None:
        self.engine.dispose()
        if self._sqlite_file is not None:
            release_sqlite_file(self._sqlite_file)
            self._sqlite_file = None


def _driver_execute(conn: Connection, sql: str) -> None:
    """`sql` on the driver's connection itself, outside any transaction SQLAlchemy began."""
    driver = conn.connection.dbapi_connection
    if driver is None:  # only once the connection was invalidated
        raise RuntimeError("the database connection is closed")
    driver.execute(sql)


def _alembic_config(conn: Connection) -> Config:
    from alembic.config import Config

    config = Config()
    # ConfigParser reads % as interpolation.
    config.set_main_option("script_location", str(MIGRATIONS).replace("%", "%%"))
    config.attributes["connection"] = conn
    return config


def _current_revision(conn: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert head is not None
    return head


# -- one process per SQLite file ------------------------------------------------------------

_held: dict[Path, tuple[int, int]] = {}  # lock file -> (descriptor, users in this process)
_held_lock = threading.Lock()


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite URL; None for other databases and in-memory ones."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database).expanduser().resolve()


def _lock_path(db_file: Path) -> Path:
    return db_file.with_name(db_file.name + ".lock")


def hold_sqlite_file(db_file: Path) -> None:
    """Take the SQLite file for this process, or raise DatabaseError naming the holder.

    Two processes on one SQLite data dir would each run the queue, sweep the other's
    files and expire its claims; one data dir serves one process, and several nodes share
    PostgreSQL instead. The lock is the kernel's (flock), so a killed process frees it.
    Within one process it is counted, so tests may open one data dir twice.
    """
    lock_path = _lock_path(db_file)
    with _held_lock:
        if lock_path in _held:
            fd, users = _held[lock_path]
            _held[lock_path] = (fd, users + 1)
            return
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DatabaseError(
                f"Another batchyard process (pid {holder}) is using the SQLite database "
                f"{db_file}. One data dir serves one process: stop the other one, choose "
                "another --data-dir, or run several nodes on one PostgreSQL database "
                "(--database-url postgresql+psycopg://…)."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        _held[lock_path] = (fd, 1)


def release_sqlite_file(db_file: Path) -> None:
    lock_path = _lock_path(db_file)
    with _held_lock:
        fd, users = _held.get(lock_path, (-1, 0))
        if users > 1:
            _held[lock_path] = (fd, users - 1)
        elif users == 1:
            del _held[lock_path]
            os.close(fd)  # closing the descriptor drops the flock
