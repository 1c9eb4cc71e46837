"""Recording: the results of the lines a node handed to its engine, written on their
Request rows in the runner's transaction, by the holder of each line's claim alone.

A result is a resolved future. Its outcome is the answer (200; a chat answer's thought under
the name `--reasoning-field` gives, as the output line will carry it), the engine's error, or a
server error for anything else the engine raised; a cancelled line is marked cancelled, and
a line whose engine was down (`EngineUnavailable`) goes back to the queue with its attempt
unused. A line this node no longer holds (cancelled, expired, or claimed again elsewhere
once its lease lapsed) is not written: so no line is recorded twice. The counters move in
SQL (lifecycle.record). A claimed line that never reaches the engine is recorded the same
way, through a future that holds its error (`failed`: `unreadable`, `exhausted`); one whose
input's store is away (`input_away`) goes back to the queue as if its engine were down.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any, NamedTuple

from sqlalchemy import case, update
from sqlmodel import Session, col, select

from app.batches.lifecycle.lifecycle import failure, lock_batches, record
from app.engine.base import EngineError, EngineUnavailable, RequestCancelled
from app.engine.reasoning import present
from app.tables import Request, RequestStatus

log = logging.getLogger("batchyard.runner")

#: The errors of a read whose store is away, not of a file that is gone: the object store
#: did not answer or refused for now (bucket.py's StoreError is EIO), a network mount that
#: dropped. A line that meets one waits in the queue; a missing file fails its lines.
STORE_AWAY_ERRNOS = frozenset(
    {
        errno.EIO,
        errno.ETIMEDOUT,
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ESTALE,
    }
)

Result = tuple[str, str, "Future[dict[str, Any]]"]  # (request id, batch id, future)
Outcome = tuple[int, dict[str, Any]]  # (HTTP status, body)


class Held(NamedTuple):
    """A line this node claimed and handed to its engine."""

    batch_id: str
    future: Future[dict[str, Any]]
    lane: str  # the engine's lane it was claimed for (claims.py)


def record_done(
    s: Session, done: list[Result], worker_id: str, held: Mapping[str, Held], *, field: str
) -> set[str]:
    """Write the results in the caller's transaction; the lanes whose engine was found
    down (their lines went back to the queue). `field` is `--reasoning-field`: where a chat
    answer's thought goes in the body written (outcome)."""
    t = time.time()
    down: set[str] = set()
    futures = {request_id: fut for request_id, _, fut in done}
    # Batch rows first, then request rows: the order every transaction keeps.
    lock_batches(s, list({bid for _, bid, _ in done}))
    # Only lines this node still holds: a cancelled, expired, or elsewhere claimed
    # again line is not ours to write.
    conn = s.connection()
    ours = conn.execute(
        select(Request.id, Request.batch_id)
        .where(
            col(Request.id).in_(sorted(futures)),
            col(Request.status) == RequestStatus.RUNNING,
            col(Request.claimed_by) == worker_id,
        )
        .order_by(col(Request.id))
        .with_for_update()
    ).all()
    cancelled: list[str] = []
    unavailable: list[str] = []
    results: list[tuple[str, str, Outcome]] = []
    for request_id, batch_id in ours:
        fut = futures[request_id]
        exc = fut.exception()
        if isinstance(exc, RequestCancelled):
            cancelled.append(request_id)
            continue
        if isinstance(exc, EngineUnavailable):
            # The engine is down, not the line bad: back to the queue, attempt unused.
            unavailable.append(request_id)
            h = held.get(request_id)
            if h is not None:
                down.add(h.lane)
            continue
        results.append((request_id, batch_id, outcome(request_id, fut, field)))
    if cancelled:
        s.exec(
            update(Request)
            .where(col(Request.id).in_(cancelled))
            .values(status=RequestStatus.CANCELLED, finished_at=int(t))
        )
    if unavailable:
        s.exec(
            update(Request)
            .where(col(Request.id).in_(unavailable))
            .values(
                status=RequestStatus.PENDING,
                lease_until=None,
                claimed_by=None,
                attempts=case((col(Request.attempts) > 0, col(Request.attempts) - 1), else_=0),
            )
        )
    record(s, results, t)
    return down


def outcome(request_id: str, fut: Future[dict[str, Any]], field: str) -> Outcome:
    """What a resolved future records: its answer (a chat answer's thought under `field`,
    as the batch's output line carries it: reasoning.present), its engine's error, or a
    server error."""
    exc = fut.exception()
    if exc is None:
        return (200, present(fut.result(), field))
    if isinstance(exc, EngineError):
        return (exc.status_code, exc.to_body())
    log.error("request=%s error=engine_failure reason=%r", request_id, exc)
    return failure(
        500,
        f"The engine failed on this request: {exc}",
        code="server_error",
        type="server_error",
    )


def failed(error: EngineError) -> Future[dict[str, Any]]:
    """The future of a claimed line that fails without reaching the engine."""
    fut: Future[dict[str, Any]] = Future()
    fut.set_exception(error)
    return fut


def exhausted(attempts: int) -> EngineError:
    """The error of a line whose every attempt ended with the server stopping."""
    return EngineError(
        f"This line was started {attempts} times and the server "
        "stopped each time; it is not tried again.",
        status_code=500,
        code="server_error",
        type="server_error",
    )


def input_away(exc: BaseException) -> bool:
    """Whether a failed read of a line's input means its store is away for now (the line
    waits) rather than the file gone or changed (the line fails)."""
    return isinstance(exc, OSError) and exc.errno in STORE_AWAY_ERRNOS


def unreadable(exc: Exception) -> EngineError:
    """The error of a claimed line whose input could not be read again."""
    return EngineError(
        f"The input line could not be read again: {exc}",
        status_code=500,
        code="server_error",
        type="server_error",
    )
