"""The rule "storage full is a 507 that says so" (app/errors.py `storage_failed`): what counts
as a full data dir, from the disk and from each database, and what the answer says."""

from __future__ import annotations

import errno
import sqlite3

import pytest
from psycopg import errors
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from app.errors import storage_failed, storage_full


def sqlite_full() -> OperationalError:
    """What SQLAlchemy raises when SQLite may not grow the database (SQLITE_FULL)."""
    engine = create_engine("sqlite://")
    with pytest.raises(OperationalError) as caught, engine.begin() as c:
        c.execute(text("CREATE TABLE t (x TEXT)"))
        c.execute(text("PRAGMA max_page_count = 2"))
        c.execute(text("INSERT INTO t VALUES (:x)"), {"x": "x" * 100_000})
    return caught.value


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_is_a_507_naming_the_reason(code: int) -> None:
    err = storage_failed(OSError(code, "No space left on device"), "the file")
    assert (err.status_code, err.code, err.type) == (507, "storage_full", "server_error")
    assert err.message == "The server could not store the file: No space left on device."


def test_a_full_database_is_full_storage_too() -> None:
    exc = sqlite_full()
    assert isinstance(exc.orig, sqlite3.OperationalError)
    err = storage_failed(exc)
    assert (err.status_code, err.code) == (507, "storage_full")
    assert "database or disk is full" in err.message and "INSERT" not in err.message


def test_postgresqls_disk_full_is_full_storage() -> None:
    wrapped = OperationalError("INSERT ...", {}, errors.DiskFull("could not extend file"))
    assert storage_full(wrapped)
    assert storage_failed(wrapped).message.endswith(": could not extend file.")


def test_another_storage_error_is_a_500_and_not_full() -> None:
    exc = OSError(errno.EIO, "Input/output error")
    assert not storage_full(exc) and not storage_full(ValueError("x"))
    err = storage_failed(exc, "the file")
    assert (err.status_code, err.code) == (500, "storage_error")
