"""The batch lifecycle: validate, claim, run, record, cancel, expire, resume, finalize.

One thread runs it. It is the only writer of batch state after creation (the API's
cancel comes here too), and the engine never touches the database: the runner hands it
request bodies and stores each result the moment its future resolves.

Claims carry a lease that the runner renews while it holds them. A crash simply stops
the renewals: when the lease runs out the line is claimed again, by the same code that
claims a fresh line. A result is written only by the holder of the claim, so no line is
recorded twice.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sqlalchemy import insert, update
from sqlmodel import Session, col, select

from app.batches.output import sweep_orphans, write_results
from app.batches.validate import validate_jsonl
from app.config import Settings
from app.db import Database
from app.engine.base import Engine, EngineError, Priority, RequestCancelled
from app.errors import APIError, error_body
from app.files.service import FileService
from app.files.storage import Storage
from app.models import Batch, BatchStatus, Request, RequestStatus, new_id, now

log = logging.getLogger("batchyard.runner")

#: A line whose claim ran out this many times (the server died while running it) fails
#: instead of taking the server down again.
MAX_ATTEMPTS = 3
#: Request rows inserted per statement while validating (SQLite's variable limit).
INSERT_CHUNK = 5000
#: Seconds between two sweeps of expired files.
SWEEP_INTERVAL = 60.0
#: Waits before each retry of an output file that could not be written (a full disk may
#: be freed); when they are used up the batch fails, naming the error.
FINALIZE_RETRY_DELAYS = (1.0, 5.0, 30.0)
EXPIRED_ERROR = {
    "code": "batch_expired",
    "message": "This request could not be executed before the completion window expired.",
}


class Runner:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        storage: Storage,
        files: FileService,
        engine: Engine | None,
        *,
        sweep_interval: float = SWEEP_INTERVAL,
        finalize_retry_delays: tuple[float, ...] = FINALIZE_RETRY_DELAYS,
    ) -> None:
        self.settings = settings
        self.db = db
        self.storage = storage
        self.files = files
        self.engine = engine
        self.worker_id = uuid.uuid4().hex[:12]
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._results: queue.Queue[tuple[str, Future[dict[str, Any]]]] = queue.Queue()
        # request id -> (batch id, future) for every line handed to the engine
        self._inflight: dict[str, tuple[str, Future[dict[str, Any]]]] = {}
        self._thread: threading.Thread | None = None
        self._last_renew = 0.0
        self._last_sweep = 0.0
        self._sweep_interval = sweep_interval
        self._finalize_retry_delays = finalize_retry_delays
        # batch id -> (failed attempts, monotonic time of the next try)
        self._finalize_failures: dict[str, tuple[int, float]] = {}
        # Set when a batch ended: deleted input files it held may be released.
        self._batch_ended = False
        #: Run every sweep interval, after the files' sweep (the services add theirs).
        self.sweeps: list[Callable[[], object]] = []
        #: Called with the transaction and the batch each time a batch reaches a final
        #: status, before it commits (the webhooks service queues its event here).
        self.end_hooks: list[Callable[[Session, Batch], object]] = []
        #: Bumped after every write the dashboard may want to show; see wait_for_change().
        self.revision = 0
        self._changed = threading.Condition()

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def _engine(self) -> Engine:
        # The runner is started (and stepped) only once an engine is attached.
        assert self.engine is not None, "the runner needs an engine"
        return self.engine

    def start(self) -> None:
        self.storage.sweep_tmp()
        sweep_orphans(self.db, self.storage)
        self._thread = threading.Thread(target=self._loop, name="batchyard-runner", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wake(self) -> None:
        self._wake.set()

    def wait_for_change(self, revision: int, timeout: float) -> int:
        """Block until the revision moves past `revision` or the timeout passes."""
        with self._changed:
            self._changed.wait_for(lambda: self.revision != revision, timeout=timeout)
            return self.revision

    def _bump(self) -> None:
        with self._changed:
            self.revision += 1
            self._changed.notify_all()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=0.25)
            self._wake.clear()
            try:
                self.step()
            except Exception:
                log.exception("runner step failed; retrying")
                time.sleep(1.0)
        for _, fut in list(self._inflight.values()):
            self._engine.cancel(fut)

    def step(self) -> None:
        """One pass over all the work there is. Public so tests can drive it directly."""
        self._record_results()
        self._renew_leases()
        self._validate_next()
        self._cancel_requested()
        self._expire_due()
        self._claim_and_submit()
        self._finalize_done()
        if time.monotonic() - self._last_sweep > self._sweep_interval:
            self._last_sweep = time.monotonic()
            self._batch_ended = False
            self.files.sweep_expired()
            for sweep in self.sweeps:
                sweep()
        elif self._batch_ended:
            self._batch_ended = False
            self.files.release_deleted()

    # -- cancel (called from an API thread) --------------------------------------------

    def cancel(self, batch_id: str) -> Batch:
        with self.db.write() as s:
            b = s.get(Batch, batch_id)
            assert b is not None
            if b.status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
                return b
            if b.status not in BatchStatus.CANCELLABLE:
                raise APIError(
                    400,
                    f"Cannot cancel batch '{batch_id}': its status is '{b.status}'. "
                    "Only a batch that is validating or in progress can be cancelled.",
                    param="batch_id",
                    code="batch_not_cancellable",
                )
            b.status = BatchStatus.CANCELLING
            b.cancelling_at = now()
            s.add(b)
            # Lines that have not started never will.
            s.exec(
                update(Request)
                .where(
                    col(Request.batch_id) == batch_id, col(Request.status) == RequestStatus.PENDING
                )
                .values(status=RequestStatus.CANCELLED, finished_at=now())
            )
        log.info("batch=%s status=cancelling", batch_id)
        self._bump()
        self.wake()
        return b

    # -- validation ---------------------------------------------------------------------

    def _validate_next(self) -> None:
        with self.db.read() as s:
            b = s.exec(
                select(Batch)
                .where(Batch.status == BatchStatus.VALIDATING)
                .order_by(col(Batch.created_ns))
            ).first()
        if b is None:
            return
        path = self.storage.path(b.input_file_id)
        try:
            with open(path, "rb") as fh:
                result = validate_jsonl(
                    fh, b.endpoint, max_requests=self.settings.max_requests_per_batch
                )
        except OSError as exc:
            self._fail_batch(
                b.id,
                [
                    {
                        "code": "file_unreadable",
                        "message": f"The input file cannot be read: {exc.strerror}.",
                        "param": "input_file_id",
                        "line": None,
                    }
                ],
            )
            return
        if not result.ok:
            self._fail_batch(b.id, result.reported_errors())
            return
        rows = [
            {
                "id": new_id("batch_req_"),
                "batch_id": b.id,
                "line": line.number,
                "custom_id": line.custom_id,
                "offset": line.offset,
                "length": line.length,
                "status": RequestStatus.PENDING,
                "attempts": 0,
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "cached_tokens": 0,
            }
            for line in result.lines
        ]
        with self.db.write() as s:
            fresh = s.get(Batch, b.id)
            if not self._still_validating(s, fresh):
                return
            assert fresh is not None
            # A crash mid-validation leaves nothing behind (this is one transaction),
            # but clear any rows anyway so validation can always start over.
            s.exec(Request.__table__.delete().where(Request.__table__.c.batch_id == b.id))  # type: ignore[attr-defined]
            for start in range(0, len(rows), INSERT_CHUNK):
                s.exec(insert(Request), params=rows[start : start + INSERT_CHUNK])
            fresh.status = BatchStatus.IN_PROGRESS
            fresh.in_progress_at = now()
            fresh.total = len(rows)
            fresh.model = result.model
            s.add(fresh)
        log.info("batch=%s status=in_progress total=%d", b.id, len(rows))
        self._bump()

    def _still_validating(self, s: Session, b: Batch | None) -> bool:
        """False when the batch left validation meanwhile; a cancel that arrived during
        validation is settled here, as the batch never ran a line."""
        if b is None or b.status != BatchStatus.VALIDATING:
            if b is not None and b.status == BatchStatus.CANCELLING:
                self._settle_cancelled_validation(s, b)
            return False
        return True

    def _settle_cancelled_validation(self, s: Session, b: Batch) -> None:
        b.status = BatchStatus.CANCELLED
        b.cancelled_at = now()
        s.add(b)
        self._ended(s, b)

    def _ended(self, s: Session, b: Batch) -> None:
        """Every transition to a final status calls this, in its transaction."""
        self._batch_ended = True
        for hook in self.end_hooks:
            hook(s, b)

    def _fail_batch(self, batch_id: str, errors: list[dict[str, Any]]) -> None:
        with self.db.write() as s:
            b = s.get(Batch, batch_id)
            if not self._still_validating(s, b):
                return
            assert b is not None
            b.status = BatchStatus.FAILED
            b.failed_at = now()
            b.errors_json = json.dumps(errors)
            s.add(b)
            self._ended(s, b)
        log.info("batch=%s status=failed errors=%d", batch_id, len(errors))
        self._bump()

    # -- claims -------------------------------------------------------------------------

    def _capacity(self) -> int:
        # Keep the engine's queue a little ahead of its slots so no slot idles between lines.
        return max(2, self._engine.info.n_slots * 2) - len(self._inflight)

    def _claim_and_submit(self) -> None:
        room = self._capacity()
        if room <= 0:
            return
        t = time.time()
        claimed: list[tuple[Request, str, str]] = []
        poisoned = 0
        with self.db.write() as s:
            candidates = s.exec(
                select(Request, Batch.endpoint, Batch.input_file_id)
                .join(Batch, col(Batch.id) == col(Request.batch_id))
                .where(
                    Batch.status == BatchStatus.IN_PROGRESS,
                    (col(Request.status) == RequestStatus.PENDING)
                    | (
                        (col(Request.status) == RequestStatus.RUNNING)
                        & (col(Request.lease_until) < t)
                    ),
                )
                .order_by(col(Batch.created_ns), col(Request.line))
                .limit(room + len(self._inflight))
                # Several runners on one PostgreSQL queue never claim the same line
                # (SQLite has one writer at a time and leaves this out).
                .with_for_update(skip_locked=True)
            ).all()
            for req, endpoint, input_file_id in candidates:
                if req.id in self._inflight:
                    continue
                if len(claimed) >= room:
                    break
                if req.attempts >= MAX_ATTEMPTS:
                    self._record(
                        s,
                        req,
                        _failure(
                            500,
                            f"This line was started {req.attempts} times and the server stopped each time; "
                            "it is not tried again.",
                            code="server_error",
                            type="server_error",
                        ),
                        t,
                    )
                    poisoned += 1
                    continue
                req.status = RequestStatus.RUNNING
                req.claimed_by = self.worker_id
                req.claimed_at = int(t)
                req.lease_until = t + self.settings.lease_seconds
                req.attempts += 1
                s.add(req)
                claimed.append((req, endpoint, input_file_id))
        for req, endpoint, input_file_id in claimed:
            self._submit(req, endpoint, input_file_id)
        if poisoned:
            self._bump()

    def _submit(self, req: Request, endpoint: str, input_file_id: str) -> None:
        try:
            raw = self.storage.read_range(input_file_id, req.offset, req.length)
            body = json.loads(raw.decode("utf-8"))["body"]
        except Exception as exc:  # the file changed under us: fail this line alone
            fut: Future[dict[str, Any]] = Future()
            fut.set_exception(
                EngineError(
                    f"The input line could not be read again: {exc}",
                    status_code=500,
                    code="server_error",
                    type="server_error",
                )
            )
        else:
            fut = self._engine.submit(endpoint, body, priority=Priority.BATCH)
        self._inflight[req.id] = (req.batch_id, fut)
        fut.add_done_callback(lambda f, rid=req.id: self._on_done(rid, f))

    def _on_done(self, request_id: str, fut: Future[dict[str, Any]]) -> None:
        self._results.put((request_id, fut))
        self._wake.set()

    def _renew_leases(self) -> None:
        t = time.time()
        if not self._inflight or t - self._last_renew < self.settings.lease_seconds / 3:
            return
        self._last_renew = t
        with self.db.write() as s:
            s.exec(
                update(Request)
                .where(
                    col(Request.claimed_by) == self.worker_id,
                    col(Request.status) == RequestStatus.RUNNING,
                )
                .values(lease_until=t + self.settings.lease_seconds)
            )

    # -- results ------------------------------------------------------------------------

    def _record_results(self) -> None:
        done: list[tuple[str, Future[dict[str, Any]]]] = []
        while True:
            try:
                done.append(self._results.get_nowait())
            except queue.Empty:
                break
        if not done:
            return
        t = time.time()
        with self.db.write() as s:
            for request_id, fut in done:
                self._inflight.pop(request_id, None)
                req = s.get(Request, request_id)
                if (
                    req is None
                    or req.status != RequestStatus.RUNNING
                    or req.claimed_by != self.worker_id
                ):
                    continue  # cancelled, expired, or claimed again elsewhere: not ours to write
                exc = fut.exception()
                if isinstance(exc, RequestCancelled):
                    req.status = RequestStatus.CANCELLED
                    req.finished_at = int(t)
                    s.add(req)
                    continue
                if exc is None:
                    outcome: tuple[int, dict[str, Any]] = (200, fut.result())
                elif isinstance(exc, EngineError):
                    outcome = (exc.status_code, exc.to_body())
                else:
                    log.error("request=%s error=engine_failure reason=%r", request_id, exc)
                    outcome = _failure(
                        500,
                        f"The engine failed on this request: {exc}",
                        code="server_error",
                        type="server_error",
                    )
                self._record(s, req, outcome, t)
        self._bump()

    def _record(
        self, s: Session, req: Request, outcome: tuple[int, dict[str, Any]], t: float
    ) -> None:
        """Store one line's result and move its batch's counters, in the caller's transaction."""
        status_code, body = outcome
        ok = status_code == 200
        usage = body.get("usage") or {} if ok else {}
        req.status = RequestStatus.SUCCEEDED if ok else RequestStatus.FAILED
        req.status_code = status_code
        req.request_id = new_id("req_")
        req.body_json = json.dumps(body)
        req.finished_at = int(t)
        # Chat and completions count prompt/completion tokens, a `response` input/output.
        req.prompt_tokens, req.completion_tokens, req.cached_tokens = usage_counts(usage)
        s.add(req)
        s.exec(
            update(Batch)
            .where(col(Batch.id) == req.batch_id)
            .values(
                completed=Batch.completed + (1 if ok else 0),
                failed=Batch.failed + (0 if ok else 1),
                input_tokens=Batch.input_tokens + req.prompt_tokens,
                output_tokens=Batch.output_tokens + req.completion_tokens,
                cached_tokens=Batch.cached_tokens + req.cached_tokens,
            )
        )

    # -- cancel, expire, finalize -------------------------------------------------------

    def _withdraw(self, batch_id: str) -> None:
        for bid, fut in list(self._inflight.values()):
            if bid == batch_id:
                self._engine.cancel(fut)

    def _cancel_requested(self) -> None:
        with self.db.read() as s:
            ids = s.exec(select(Batch.id).where(Batch.status == BatchStatus.CANCELLING)).all()
        for batch_id in ids:
            self._withdraw(batch_id)
            if any(bid == batch_id for bid, _ in self._inflight.values()):
                continue  # their cancelled futures come back through _record_results
            with self.db.write() as s:
                # Claims left by a runner that died: nobody will finish them now.
                s.exec(
                    update(Request)
                    .where(
                        col(Request.batch_id) == batch_id,
                        col(Request.status).in_((RequestStatus.PENDING, RequestStatus.RUNNING)),
                    )
                    .values(status=RequestStatus.CANCELLED, finished_at=now())
                )
                b = s.get(Batch, batch_id)
                if b is not None and b.total == 0 and b.in_progress_at is None:
                    self._settle_cancelled_validation(s, b)
                    continue
            self._finalize(batch_id, BatchStatus.CANCELLED)

    def _expire_due(self) -> None:
        t = now()
        with self.db.read() as s:
            ids = s.exec(
                select(Batch.id).where(
                    col(Batch.status).in_(BatchStatus.CANCELLABLE),
                    col(Batch.expires_at) <= t,
                )
            ).all()
        for batch_id in ids:
            self._withdraw(batch_id)
            with self.db.write() as s:
                b = s.get(Batch, batch_id)
                # Both statuses can still run out of their window (and both can be cancelled).
                if b is None or b.status not in BatchStatus.CANCELLABLE:
                    continue
                result = s.exec(
                    update(Request)
                    .where(
                        col(Request.batch_id) == batch_id,
                        col(Request.status).in_((RequestStatus.PENDING, RequestStatus.RUNNING)),
                    )
                    .values(
                        status=RequestStatus.EXPIRED,
                        finished_at=t,
                        error_json=json.dumps(EXPIRED_ERROR),
                    )
                )
                b.failed += result.rowcount or 0
                b.expired_at = t
                # finalizing with expired_at set: a crash from here on still ends as expired.
                b.status = BatchStatus.FINALIZING
                b.finalizing_at = t
                s.add(b)
            log.info("batch=%s status=expired", batch_id)
            self._bump()
            self._finalize(batch_id, BatchStatus.EXPIRED)

    def _finalize_done(self) -> None:
        with self.db.read() as s:
            open_lines = (
                select(Request.id)
                .where(
                    col(Request.batch_id) == Batch.id,
                    col(Request.status).in_((RequestStatus.PENDING, RequestStatus.RUNNING)),
                )
                .exists()
            )
            ready = s.exec(
                select(Batch.id, Batch.status, Batch.expired_at).where(
                    (col(Batch.status) == BatchStatus.FINALIZING)
                    | ((col(Batch.status) == BatchStatus.IN_PROGRESS) & ~open_lines)
                )
            ).all()
        for batch_id, status, expired_at in ready:
            if status == BatchStatus.IN_PROGRESS:
                with self.db.write() as s:
                    b = s.get(Batch, batch_id)
                    if b is None or b.status != BatchStatus.IN_PROGRESS:
                        continue
                    b.status = BatchStatus.FINALIZING
                    b.finalizing_at = now()
                    s.add(b)
                log.info("batch=%s status=finalizing", batch_id)
                self._bump()
            self._finalize(batch_id, BatchStatus.EXPIRED if expired_at else BatchStatus.COMPLETED)

    def _finalize(self, batch_id: str, final_status: str) -> None:
        """Write the output and error files, then end the batch, in that order.

        The files get their rows and the batch its final status in one transaction, so a
        crash in between leaves the batch finalizing (or cancelling) and this runs again;
        the bytes of the lost attempt are swept as orphans.
        """
        failures, next_try = self._finalize_failures.get(batch_id, (0, 0.0))
        if time.monotonic() < next_try:
            return
        with self.db.read() as s:
            b = s.get(Batch, batch_id)
        if b is None:
            return
        try:
            written = write_results(self.db, self.storage, b)
        except OSError as exc:
            # write_results discarded its partial files: nothing half-written is left.
            self._output_write_failed(b, exc, failures + 1)
            return
        self._finalize_failures.pop(batch_id, None)
        stamp = now()
        # OpenAI anchors output_expires_after on the output file's creation, not the batch's.
        expires_at = stamp + b.output_expires_after if b.output_expires_after else None
        with self.db.write() as s:
            fresh = s.get(Batch, batch_id)
            if fresh is None or fresh.status in BatchStatus.FINISHED:
                for w in written.values():
                    self.storage.delete(w.file_id)
                return
            for kind, w in written.items():
                self.files.register_output(
                    s, fresh, kind, w, created_at=stamp, expires_at=expires_at
                )
            fresh.output_file_id = written["output"].file_id if "output" in written else None
            fresh.error_file_id = written["error"].file_id if "error" in written else None
            fresh.status = final_status
            if final_status == BatchStatus.COMPLETED:
                fresh.completed_at = stamp
            elif final_status == BatchStatus.CANCELLED:
                fresh.cancelled_at = stamp
            elif final_status == BatchStatus.EXPIRED and fresh.expired_at is None:
                fresh.expired_at = stamp
            s.add(fresh)
            self._ended(s, fresh)
        log.info(
            "batch=%s status=%s completed=%d failed=%d",
            batch_id,
            final_status,
            b.completed,
            b.failed,
        )
        self._bump()

    def _output_write_failed(self, b: Batch, exc: OSError, failures: int) -> None:
        reason = f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
        if failures <= len(self._finalize_retry_delays):
            delay = self._finalize_retry_delays[failures - 1]
            log.error(
                "batch=%s error=output_write_failed reason=%r retry_in=%.0fs",
                b.id,
                reason,
                delay,
            )
            self._finalize_failures[b.id] = (failures, time.monotonic() + delay)
            return
        self._finalize_failures.pop(b.id, None)
        log.error("batch=%s status=failed error=output_write_failed reason=%r", b.id, reason)
        with self.db.write() as s:
            fresh = s.get(Batch, b.id)
            if fresh is None or fresh.status in BatchStatus.FINISHED:
                return
            fresh.status = BatchStatus.FAILED
            fresh.failed_at = now()
            fresh.errors_json = json.dumps(
                [
                    {
                        "code": "output_write_failed",
                        "message": f"The output and error files could not be written to the "
                        f"server's data dir: {reason}. Tried {failures} times.",
                        "param": None,
                        "line": None,
                    }
                ]
            )
            s.add(fresh)
            self._ended(s, fresh)
        self._bump()


def usage_counts(usage: dict[str, Any]) -> tuple[int, int, int]:
    """(prompt, completion, cached) tokens of one line's `usage`, in chat/completions names
    (`prompt_tokens`, `prompt_tokens_details`) or responses names (`input_tokens`, ...)."""
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    return int(prompt or 0), int(completion or 0), int(cached or 0)


def _failure(
    status_code: int, message: str, *, code: str, type: str = "invalid_request_error"
) -> tuple[int, dict[str, Any]]:
    return status_code, error_body(message, type=type, code=code)
