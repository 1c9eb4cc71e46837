"""Output and error JSONL writers: one line per finished request, in input order."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from typing import Any

from sqlalchemy import select as select_columns
from sqlmodel import col, select

from app.db import Database
from app.files.storage import PartialWrite, Storage, Written
from app.tables import Batch, File, Request, RequestStatus, new_id
from app.wire.batches import batch_output_line, encode_line

#: Rows read from the database at a time while writing, so 50,000 results never sit in memory.
CHUNK = 1000
#: Output files have no size cap of their own; their inputs were capped.
NO_LIMIT = 1 << 62


def write_results(db: Database, storage: Storage, batch: Batch) -> dict[str, Written]:
    """Write the output file (successes) and the error file (failures, expired lines).

    Returns what was written by kind ("output", "error"); a kind with no lines gets no file.
    The bytes land under fresh ids; the caller gives them File rows.
    """
    writers: dict[str, PartialWrite] = {}
    try:
        finished = (RequestStatus.SUCCEEDED, RequestStatus.FAILED, RequestStatus.EXPIRED)
        for r in all_result_rows(db, batch.id, finished):
            kind = "output" if r.status == RequestStatus.SUCCEEDED else "error"
            if kind not in writers:
                writers[kind] = storage.begin_write(NO_LIMIT)
            writers[kind].write(encode_line(batch_output_line(r)))
        written: dict[str, Written] = {}
        for kind, w in writers.items():
            file_id = w.file_id or new_id("file-")
            w.commit(file_id)
            written[kind] = Written(file_id, w.size, w.sha256)
        return written
    except BaseException:
        for w in writers.values():
            w.discard()
        raise


def _result_query(batch_id: str, statuses: Collection[str]) -> Any:
    """The batch's lines in `statuses`, in input order, as plain rows of the columns an
    output line needs (an ORM object for each line cost more than writing it)."""
    return (
        select_columns(
            col(Request.line),
            col(Request.id),
            col(Request.custom_id),
            col(Request.status),
            col(Request.status_code),
            col(Request.request_id),
            col(Request.body_json).label("body_json"),
            col(Request.error_json).label("error_json"),
        )
        .where(col(Request.batch_id) == batch_id, col(Request.status).in_(sorted(statuses)))
        .order_by(col(Request.line))
    )


def result_rows(
    db: Database, batch_id: str, statuses: Collection[str], after_line: int
) -> Sequence[Any]:
    """The next CHUNK of the batch's lines in `statuses` after `after_line` (a reader that
    may pause between chunks, like a download, holds no transaction meanwhile)."""
    query = _result_query(batch_id, statuses).where(col(Request.line) > after_line)
    with db.read() as s:
        return s.connection().execute(query.limit(CHUNK)).all()


def all_result_rows(db: Database, batch_id: str, statuses: Collection[str]) -> Iterator[Any]:
    """Every one of the batch's lines in `statuses`, in input order, from one query read
    CHUNK rows at a time (a server-side cursor on PostgreSQL). Finalize writes them as fast
    as they come; chunk by chunk with `result_rows`, a 50,000-line batch just finished on
    PostgreSQL took 1.7 s of queries against 0.45 s on SQLite (bench/fleet.py)."""
    with db.snapshot() as conn:
        streamed = conn.execution_options(stream_results=True, yield_per=CHUNK)
        yield from streamed.execute(_result_query(batch_id, statuses))


def sweep_orphans(db: Database, storage: Storage, min_age: float = 0.0) -> int:
    """Delete stored bytes that no File row names (left by a crash during finalizing),
    older than `min_age` seconds (younger ones may be another node's output in the making)."""
    with db.read() as s:
        known = set(s.exec(select(File.id)).all())
    removed = 0
    for file_id, age in list(storage.stored_files()):
        if file_id not in known and (min_age <= 0 or age > min_age):
            storage.delete(file_id)
            removed += 1
    return removed
