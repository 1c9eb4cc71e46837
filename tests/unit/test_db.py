"""The database layer's sessions: how writes queue on SQLite and what a read is on each server."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sqlalchemy import event, func, text
from sqlmodel import Session, select

from app.db import Database
from app.tables import File


def sqlite_db(tmp_path: Path) -> Database:
    db = Database(f"sqlite:///{tmp_path / 'by.db'}")
    db.migrate()
    return db


def count(s: Session) -> int:
    return s.exec(select(func.count()).select_from(File)).one()


def a_file(i: int) -> File:
    return File(id=f"file-{i}", filename="x.jsonl", purpose="batch", bytes=1, sha256="0")


def test_sqlite_writers_queue_in_the_process_not_in_sqlite(tmp_path: Path) -> None:
    """A second writer waits for the first on the process's lock and never reaches BEGIN
    IMMEDIATE while the first is open, so it does not sleep in SQLite's busy handler."""
    db = sqlite_db(tmp_path)
    begins: list[float] = []

    @event.listens_for(db.engine, "before_cursor_execute")
    def _count(conn, cursor, statement, *_):  # type: ignore[no-untyped-def]
        if statement.startswith("BEGIN IMMEDIATE"):
            begins.append(time.monotonic())

    first_open, release = threading.Event(), threading.Event()

    def first() -> None:
        with db.write() as s:
            s.add(a_file(1))
            s.flush()
            first_open.set()
            release.wait(10)

    def second() -> None:
        with db.write() as s:
            s.add(a_file(2))

    t1 = threading.Thread(target=first)
    t1.start()
    assert first_open.wait(10)
    t2 = threading.Thread(target=second)
    t2.start()
    time.sleep(0.3)
    assert len(begins) == 1 and t2.is_alive()  # the second waits before BEGIN
    released = time.monotonic()
    release.set()
    t1.join(10)
    t2.join(10)
    assert len(begins) == 2 and begins[1] >= released
    with db.read() as s:
        assert set(s.exec(select(File.id)).all()) == {"file-1", "file-2"}
    db.close()


def test_sqlite_writes_from_many_threads_all_land(tmp_path: Path) -> None:
    db = sqlite_db(tmp_path)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(20):
                with db.write() as s:
                    s.add(a_file(n * 100 + i))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    with db.read() as s:
        assert count(s) == 16 * 20
    db.close()


def test_a_sqlite_read_is_one_snapshot(tmp_path: Path) -> None:
    """SQLite reads keep their transaction: a write committed between two statements of
    one read is not seen by the second."""
    db = sqlite_db(tmp_path)
    with db.read() as s:
        before = count(s)
        writer = threading.Thread(target=lambda: _write_one(db))
        writer.start()
        writer.join(10)
        assert count(s) == before
    with db.read() as s:
        assert count(s) == before + 1
    db.close()


def _write_one(db: Database) -> None:
    with db.write() as s:
        s.add(a_file(7))


def test_postgres_reads_run_without_a_transaction(postgres_url: str) -> None:
    """A PostgreSQL read sends no BEGIN: each statement is its own transaction, so now()
    moves between two statements of one read; in a write it stays the transaction's start."""
    db = Database(postgres_url)
    try:
        with db.read() as s:
            first = s.execute(text("SELECT now()")).scalar()
            time.sleep(0.02)
            second = s.execute(text("SELECT now()")).scalar()
            assert s.connection().connection.dbapi_connection.autocommit  # type: ignore[union-attr]
        assert second > first
        with db.write() as s:
            first = s.execute(text("SELECT now()")).scalar()
            time.sleep(0.02)
            assert s.execute(text("SELECT now()")).scalar() == first
        # The pool's connection went back as it came: the next write is a transaction again.
        with db.write() as s:
            assert not s.connection().connection.dbapi_connection.autocommit  # type: ignore[union-attr]
    finally:
        db.close()
