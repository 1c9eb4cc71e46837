"""Migrations: a fresh database matches app/tables.py, and 0.1.0's databases upgrade whole.

The 0.1.0 tables come from tests/data/tables_0_1_0.*.sql, the DDL that 0.1.0's create_all
emitted (app/tables.py at 77d2e77), with rows in them; start-up (build_services, which
calls Database.migrate) must stamp, upgrade and keep every row, and the runner must then
finish the batch that was in progress.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Float, create_engine, inspect, text
from sqlmodel import SQLModel

from app.config import Settings
from app.db import Database, DatabaseError, head_revision
from app.migrations import compare_type
from app.services import build_services
from app.tables import Batch, BatchStatus, File, Request
from tests.factories import batch_line, jsonl
from tests.fakes import FakeEngine
from tests.unit.helpers import drive, file_lines

DATA = Path(__file__).resolve().parent.parent / "data"
TABLES = ("file", "batch", "request")


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'data' / 'batchyard.db'}"
    return str(request.getfixturevalue("postgres_url"))


def differences(db: Database) -> list[Any]:
    with db.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": compare_type})
        return list(compare_metadata(context, SQLModel.metadata))


def test_a_fresh_database_is_exactly_the_models(database_url: str) -> None:
    """Fails when app/tables.py changes without a revision (or a revision without the model)."""
    Path(database_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    db = Database(database_url)
    try:
        db.migrate()
        assert db.revision() == head_revision()
        assert differences(db) == [], (
            "app/tables.py and app/migrations/versions disagree: add a revision "
            "(app/migrations/README.md)"
        )
        db.migrate()  # a second start changes nothing
        assert db.revision() == head_revision()
    finally:
        db.close()


#: A unix time past 2038-01-19, where a 32-bit INTEGER column overflows.
AFTER_2038 = 2**31 + 10


def test_every_timestamp_holds_a_time_past_2038(database_url: str) -> None:
    Path(database_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    db = Database(database_url)
    try:
        db.migrate()
        if not database_url.startswith("sqlite"):  # SQLite's INTEGER is 64-bit already
            with db.engine.connect() as conn:
                inspector = inspect(conn)
                narrow = [
                    f"{table}.{c['name']}"
                    for table in inspector.get_table_names()
                    for c in inspector.get_columns(table)
                    if c["name"].endswith("_at")
                    and not isinstance(c["type"], Float)
                    and type(c["type"]).__name__ != "BIGINT"
                ]
            assert narrow == [], "integer timestamps that overflow in 2038"
        with db.write() as s:
            s.add(
                File(
                    id="file-late",
                    filename="f",
                    purpose="batch",
                    bytes=1,
                    created_at=AFTER_2038,
                    expires_at=AFTER_2038 + 1,
                )
            )
            s.add(
                Batch(
                    id="batch_late",
                    endpoint="/v1/chat/completions",
                    input_file_id="file-late",
                    created_at=AFTER_2038,
                    expires_at=AFTER_2038 + 86400,
                    cancelled_at=AFTER_2038 + 2,
                )
            )
            s.add(
                Request(
                    id="batch_req_late",
                    batch_id="batch_late",
                    line=1,
                    custom_id="a",
                    offset=0,
                    length=1,
                    claimed_at=AFTER_2038,
                    finished_at=AFTER_2038 + 3,
                )
            )
        with db.read() as s:
            f, b, r = (
                s.get(File, "file-late"),
                s.get(Batch, "batch_late"),
                s.get(Request, "batch_req_late"),
            )
            assert f is not None and b is not None and r is not None
            assert (f.created_at, f.expires_at) == (AFTER_2038, AFTER_2038 + 1)
            assert (b.expires_at, b.cancelled_at) == (AFTER_2038 + 86400, AFTER_2038 + 2)
            assert (r.claimed_at, r.finished_at) == (AFTER_2038, AFTER_2038 + 3)
    finally:
        db.close()


def legacy_rows(input_file: str) -> dict[str, list[dict[str, Any]]]:
    """A finished batch and one in progress (a line done, two pending), as 0.1.0 left them.

    created_ns values fit 32 bits: 0.1.0's INTEGER column on PostgreSQL could hold no
    larger one (revision 0002 widens it); on SQLite they are real nanoseconds."""
    base = {"owner": "", "completion_window": "24h", "endpoint": "/v1/chat/completions"}
    zero = {"input_tokens": 0, "output_tokens": 0, "failed": 0}
    line = {"status_code": None, "request_id": None, "body": None, "error": None}
    line |= {"claimed_by": None, "claimed_at": None, "lease_until": None, "finished_at": None}
    body = {"id": "chatcmpl-1", "object": "chat.completion", "usage": {"prompt_tokens": 3}}
    return {
        "file": [
            {"id": input_file, "owner": "", "filename": "in.jsonl", "purpose": "batch",
             "bytes": 0, "sha256": "", "created_at": 1700000000, "created_ns": 1001,
             "expires_at": None},
            {"id": "file-old", "owner": "", "filename": "old.jsonl", "purpose": "batch",
             "bytes": 12, "sha256": "ab", "created_at": 1700000001, "created_ns": 1002,
             "expires_at": 1900000000},
        ],
        "batch": [
            {**base, **zero, "id": "batch_done", "input_file_id": "file-old",
             "status": BatchStatus.CANCELLED, "model": "m", "metadata": '{"k": "v"}',
             "errors": None, "output_file_id": None, "error_file_id": None,
             "output_expires_after": None, "created_at": 1700000001, "created_ns": 2001,
             "expires_at": 1700086401, "in_progress_at": 1700000002, "finalizing_at": None,
             "completed_at": None, "failed_at": None, "expired_at": None,
             "cancelling_at": 1700000003, "cancelled_at": 1700000004, "total": 0,
             "completed": 0},
            {**base, **zero, "id": "batch_running", "input_file_id": input_file,
             "status": BatchStatus.IN_PROGRESS, "model": "m", "metadata": None,
             "errors": None, "output_file_id": None, "error_file_id": None,
             "output_expires_after": None, "created_at": 1700000002, "created_ns": 2002,
             "expires_at": 2000000000, "in_progress_at": 1700000003, "finalizing_at": None,
             "completed_at": None, "failed_at": None, "expired_at": None,
             "cancelling_at": None, "cancelled_at": None, "total": 3, "completed": 1},
        ],
        "request": [
            {**line, "id": "batch_req_1", "batch_id": "batch_running", "line": 1,
             "custom_id": "a", "offset": 0, "length": 0, "status": "succeeded",
             "attempts": 1, "claimed_by": "w0", "claimed_at": 1700000004,
             "lease_until": 1700000034.5, "finished_at": 1700000005, "status_code": 200,
             "request_id": "req_1", "body": json.dumps(body), "prompt_tokens": 3,
             "completion_tokens": 2},
            {**line, "id": "batch_req_2", "batch_id": "batch_running", "line": 2,
             "custom_id": "b", "offset": 0, "length": 0, "status": "pending", "attempts": 0,
             "prompt_tokens": 0, "completion_tokens": 0},
            {**line, "id": "batch_req_3", "batch_id": "batch_running", "line": 3,
             "custom_id": "c", "offset": 0, "length": 0, "status": "pending", "attempts": 0,
             "prompt_tokens": 0, "completion_tokens": 0},
        ],
    }  # fmt: skip


def make_legacy(url: str, data_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """0.1.0's tables and rows at `url`, and the in-progress batch's input file in `data_dir`."""
    lines = [batch_line(c, f"hi {c}") for c in "abc"]
    raw = jsonl(*lines)
    (data_dir / "files").mkdir(parents=True, exist_ok=True)
    (data_dir / "files" / "file-legacyinput").write_bytes(raw)
    rows = legacy_rows("file-legacyinput")
    offsets = [0]
    for chunk in raw.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(chunk))
    rows["file"][0]["bytes"] = len(raw)
    for req in rows["request"]:
        req["offset"] = offsets[req["line"] - 1]
        req["length"] = offsets[req["line"]] - offsets[req["line"] - 1] - 1
    dialect = "sqlite" if url.startswith("sqlite") else "postgresql"
    ddl = (DATA / f"tables_0_1_0.{dialect}.sql").read_text()
    engine = create_engine(url)
    with engine.begin() as conn:
        for statement in ddl.split(";"):
            if statement.strip().removeprefix("--").strip() and "CREATE" in statement:
                conn.exec_driver_sql(statement)
        for table in TABLES:
            for row in rows[table]:
                names = ", ".join(f'"{k}"' for k in row)
                marks = ", ".join(f":{k}" for k in row)
                conn.execute(text(f'INSERT INTO "{table}" ({names}) VALUES ({marks})'), row)
    engine.dispose()
    return rows


def read_rows(db: Database, table: str) -> list[dict[str, Any]]:
    with db.engine.connect() as conn:
        result = conn.execute(text(f'SELECT * FROM "{table}" ORDER BY id'))
        return [dict(r._mapping) for r in result]


def test_a_0_1_0_database_is_upgraded_at_start_up_with_every_row(
    database_url: str, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    before = make_legacy(database_url, data_dir)
    settings = Settings(data_dir=str(data_dir), database_url=database_url)
    svc = build_services(settings, FakeEngine())  # start-up: Database.migrate()
    try:
        assert svc.db.revision() == head_revision()
        for table in TABLES:
            want = sorted(before[table], key=lambda r: r["id"])
            got = read_rows(svc.db, table)
            # 0.1.0's columns as they were; later revisions' columns at their defaults.
            assert len(got) == len(want)
            assert [{k: row[k] for k in old} for row, old in zip(got, want, strict=True)] == want
        assert {r["cached_tokens"] for r in read_rows(svc.db, "request")} == {0}
        assert {r["cached_tokens"] for r in read_rows(svc.db, "batch")} == {0}
        assert {r["deleted_at"] for r in read_rows(svc.db, "file")} == {None}
        assert differences(svc.db) == []
        # The upgraded database works: the batch 0.1.0 left in progress finishes.
        b = drive(svc, "batch_running")
        assert (b.status, b.total, b.completed, b.failed) == (BatchStatus.COMPLETED, 3, 3, 0)
        assert [o["custom_id"] for o in file_lines(svc, b.output_file_id)] == ["a", "b", "c"]
        # A new upload gets a real nanosecond created_ns, on both databases.
        partial = svc.storage.begin_write(10_000)
        partial.write(jsonl(batch_line("z", "hi")))
        new = svc.files.create(partial=partial, filename="n.jsonl", purpose="batch", owner="")
        assert new.id in {r["id"] for r in read_rows(svc.db, "file")}
    finally:
        svc.db.close()


def test_a_database_with_only_some_of_the_tables_is_left_alone(database_url: str) -> None:
    Path(database_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.exec_driver_sql('CREATE TABLE "file" (id VARCHAR PRIMARY KEY)')
    engine.dispose()
    db = Database(database_url)
    try:
        with pytest.raises(DatabaseError, match="not batch, request"):
            db.migrate()
        assert db.revision() is None
    finally:
        db.close()
