"""Finalize: write a batch's output and error files, then end it, exactly once.

On several nodes one batch is finalized by one node: the node that moves it to
finalizing writes its files at once, and a batch left finalizing (its node died) is
taken over only when its finalizing_at is older than the lease. Should two nodes still
write files for one batch, the batch row's lock in the last transaction lets the first
one end it, and the other deletes its copies.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection

from sqlalchemy import update
from sqlmodel import col, select

from app.batches.lifecycle import output
from app.batches.lifecycle.lifecycle import OPEN, Ended, end, locked_batch, no_hook
from app.config import Settings
from app.db import Database
from app.files.service import FileService
from app.files.storage import Storage
from app.tables import Batch, BatchStatus, Request, now

log = logging.getLogger("batchyard.runner")

#: Waits before each retry of an output file that could not be written (a full disk may
#: be freed); when they are used up the batch fails, naming the error.
FINALIZE_RETRY_DELAYS = (1.0, 5.0, 30.0)


class Finalizer:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        storage: Storage,
        files: FileService,
        *,
        retry_delays: tuple[float, ...] = FINALIZE_RETRY_DELAYS,
        ended: Ended = no_hook,
    ) -> None:
        self.settings = settings
        self.db = db
        self.storage = storage
        self.files = files
        self.retry_delays = retry_delays
        self.ended = ended
        # batch id -> (failed attempts, monotonic time of the next try): batches this node
        # is finalizing and will try again.
        self._failures: dict[str, tuple[int, float]] = {}

    def finalize_ready(self, batch_ids: Collection[str] | None = None) -> None:
        """Finalize batches whose lines are all done, and those left finalizing; only
        among `batch_ids` when given (the batches whose results were just recorded)."""
        with self.db.read() as s:
            open_lines = (
                select(Request.id)
                .where(col(Request.batch_id) == Batch.id, col(Request.status).in_(OPEN))
                .exists()
            )
            query = select(Batch.id, Batch.status, Batch.expired_at).where(
                (col(Batch.status) == BatchStatus.FINALIZING)
                | ((col(Batch.status) == BatchStatus.IN_PROGRESS) & ~open_lines)
            )
            if batch_ids is not None:
                query = query.where(col(Batch.id).in_(sorted(batch_ids)))
            ready = s.exec(query).all()
        for batch_id, status, expired_at in ready:
            if status == BatchStatus.IN_PROGRESS:
                if not self._start(batch_id):
                    continue
            elif batch_id not in self._failures and not self._take_over(batch_id):
                continue
            self.finalize(batch_id, BatchStatus.EXPIRED if expired_at else BatchStatus.COMPLETED)

    def _start(self, batch_id: str) -> bool:
        """Move the batch to finalizing; True when this node did (and so finalizes it)."""
        with self.db.write() as s:
            b = locked_batch(s, batch_id)
            if b is None or b.status != BatchStatus.IN_PROGRESS:
                return False
            b.status = BatchStatus.FINALIZING
            b.finalizing_at = now()
            s.add(b)
        log.info("batch=%s status=finalizing", batch_id)
        return True

    def _take_over(self, batch_id: str) -> bool:
        """Claim a batch some node left finalizing. One process owns a SQLite file (the
        lock in app/db.py), so there it is always this one's; on PostgreSQL the claim is
        finalizing_at moved forward, once the lease has run out."""
        if self.db.is_sqlite:
            return True
        t = now()
        with self.db.write() as s:
            result = s.exec(
                update(Batch)
                .where(
                    col(Batch.id) == batch_id,
                    col(Batch.status) == BatchStatus.FINALIZING,
                    col(Batch.finalizing_at) <= t - self.settings.lease_seconds,
                )
                .values(finalizing_at=t)
            )
            return bool(result.rowcount)

    def finalize(self, batch_id: str, final_status: str) -> None:
        """Write the output and error files, then end the batch, in that order.

        The files get their rows and the batch its final status in one transaction, so a
        crash in between leaves the batch finalizing (or cancelling) and this runs again;
        the bytes of the lost attempt are swept as orphans.
        """
        failures, next_try = self._failures.get(batch_id, (0, 0.0))
        if time.monotonic() < next_try:
            return
        with self.db.read() as s:
            b = s.get(Batch, batch_id)
        if b is None:
            return
        try:
            written = output.write_results(self.db, self.storage, b)
        except OSError as exc:
            # write_results discarded its partial files: nothing half-written is left.
            self._write_failed(b, exc, failures + 1)
            return
        self._failures.pop(batch_id, None)
        stamp = now()
        # OpenAI anchors output_expires_after on the output file's creation, not the batch's.
        expires_at = stamp + b.output_expires_after if b.output_expires_after else None
        with self.db.write() as s:
            fresh = locked_batch(s, batch_id)
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
            end(s, fresh, final_status, self.ended, stamp)
        log.info(
            "batch=%s status=%s completed=%d failed=%d",
            batch_id,
            final_status,
            fresh.completed,
            fresh.failed,
        )

    def _write_failed(self, b: Batch, exc: OSError, failures: int) -> None:
        reason = f"{exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
        if failures <= len(self.retry_delays):
            delay = self.retry_delays[failures - 1]
            log.error(
                "batch=%s error=output_write_failed reason=%r retry_in=%.0fs",
                b.id,
                reason,
                delay,
            )
            self._failures[b.id] = (failures, time.monotonic() + delay)
            return
        self._failures.pop(b.id, None)
        log.error("batch=%s status=failed error=output_write_failed reason=%r", b.id, reason)
        with self.db.write() as s:
            fresh = locked_batch(s, b.id)
            if fresh is None or fresh.status in BatchStatus.FINISHED:
                return
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
            end(s, fresh, BatchStatus.FAILED, self.ended)
