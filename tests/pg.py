"""PostgreSQL for tests: a fresh database per test session, a fresh schema per test.

Tests that need PostgreSQL take the `postgres_url` fixture (tests/conftest.py); they skip,
saying how to point them at a server, when none answers at BATCHYARD_TEST_DATABASE_URL.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, make_url, text

from harness.postgres import PgDatabase

URL_VARIABLE = "BATCHYARD_TEST_DATABASE_URL"
DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def server_url() -> str:
    return os.environ.get(URL_VARIABLE) or DEFAULT_URL


def unreachable() -> str | None:
    """Why PostgreSQL cannot be used for tests, as a skip message; None when it can."""
    url = server_url()
    try:
        engine = create_engine(url, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (
            f"PostgreSQL is not reachable at {make_url(url).render_as_string(hide_password=True)} "
            f"({first}); set {URL_VARIABLE}=postgresql+psycopg://USER@HOST:PORT/DB to a server "
            "where that user may CREATE DATABASE"
        )
    return None


@contextmanager
def fresh_database() -> Iterator[str]:
    """A new, empty database on the test server (batchyard_test_<random>), dropped after."""
    db = PgDatabase(server_url(), prefix="batchyard_test")
    try:
        yield db.url
    finally:
        db.drop()


@contextmanager
def fresh_schema(database_url: str) -> Iterator[str]:
    """A new schema in `database_url`'s database and a URL whose connections use it."""
    name = f"t_{secrets.token_hex(6)}"
    engine = create_engine(database_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{name}"'))
    url = make_url(database_url)
    try:
        yield url.update_query_dict({"options": f"-csearch_path={name}"}).render_as_string(
            hide_password=False
        )
    finally:
        with engine.connect() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
        engine.dispose()
