"""The database: SQLModel engine, SQLite pragmas, and read / write sessions."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event
from sqlalchemy.engine import Engine as SAEngine
from sqlmodel import Session, SQLModel, create_engine

from app import models  # noqa: F401  (registers the tables)


class Database:
    """One SQLAlchemy engine; `write()` sessions begin IMMEDIATE on SQLite.

    A deferred read-then-write transaction in SQLite fails at once with "database is
    locked" when another writer got in between; taking the write lock up front makes
    the writer wait (busy_timeout) instead.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        connect_args = {"check_same_thread": False, "timeout": 30} if self.is_sqlite else {}
        self.engine: SAEngine = create_engine(url, connect_args=connect_args, pool_pre_ping=True)
        if self.is_sqlite:
            self._install_sqlite_hooks()
        self._writer = self.engine.execution_options(batchyard_immediate=True)

    def _install_sqlite_hooks(self) -> None:
        @event.listens_for(self.engine, "connect")
        def _on_connect(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            # Let SQLAlchemy's "begin" event emit BEGIN itself (pysqlite's own is deferred).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(self.engine, "begin")
        def _on_begin(conn) -> None:  # type: ignore[no-untyped-def]
            immediate = conn.get_execution_options().get("batchyard_immediate")
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    def create_all(self) -> None:
        SQLModel.metadata.create_all(self.engine)

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A short write transaction: committed on success, rolled back on error."""
        with Session(self._writer, expire_on_commit=False) as session:
            with session.begin():
                yield session

    def close(self) -> None:
        self.engine.dispose()
