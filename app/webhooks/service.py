"""The webhooks service: batch events queued in the database, sent by a delivery thread.

When a batch reaches a final status the runner calls `enqueue` in the transaction that
sets it, so the event is stored if and only if the status is: a crash loses neither. The
delivery thread sends what is due, a 2xx marks it delivered, and anything else (an error
status, a refused connection, a timeout) schedules the next attempt after
`retry_delay(attempts)`: base * 2^(attempts - 1) seconds, at most the max delay apart,
until the retry window (72 hours) after the event is spent. The body and the event id are
stored, so every attempt, and every redelivery from the dashboard, sends the same event.

Each attempt claims its row first (its next attempt moves a claim period ahead), so a
thread that dies mid-send leaves the row to be tried again, never lost.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

import httpx
from sqlmodel import Session, col, select

from app import __version__
from app.auth.keys import owner_id
from app.config import Settings
from app.db import Database
from app.errors import not_found
from app.runtime.polling import PollingThread
from app.tables import Batch, BatchStatus, DeliveryStatus, WebhookDelivery, new_id, now
from app.webhooks import signing

log = logging.getLogger("batchyard.webhooks")

#: The event each final status sends (OpenAI's names).
EVENT_TYPES = {
    BatchStatus.COMPLETED: "batch.completed",
    BatchStatus.FAILED: "batch.failed",
    BatchStatus.EXPIRED: "batch.expired",
    BatchStatus.CANCELLED: "batch.cancelled",
}
#: Seconds one attempt may take (connect, send, answer).
SEND_TIMEOUT = 10.0
#: A claimed row is tried again after this long if its attempt never recorded an outcome.
CLAIM_SECONDS = 60.0
#: Seconds between two looks for due deliveries when nothing woke the thread.
POLL_INTERVAL = 1.0
#: Rows sent per pass of the delivery thread.
PASS_LIMIT = 20
#: How much of an error answer's body is kept with the delivery.
ERROR_TEXT = 300


@dataclass(frozen=True)
class Endpoint:
    url: str
    secret: str


class WebhookService:
    def __init__(self, settings: Settings, db: Database) -> None:
        self.settings = settings
        self.db = db
        self._by_owner: dict[str, Endpoint] = {}
        for key, options in settings.api_key_options().items():
            if options.get("webhook_url"):
                self._by_owner[owner_id(key)] = Endpoint(
                    options["webhook_url"], options["webhook_secret"]
                )
        self._default = (
            Endpoint(settings.webhook_url, settings.webhook_secret)
            if settings.webhook_url
            else None
        )
        self._thread = PollingThread(
            "batchyard-webhooks", self._send_all_due, POLL_INTERVAL, log=log
        )
        self._http: httpx.Client | None = None

    def endpoint_for(self, owner: str) -> Endpoint | None:
        """The owner's key's own endpoint, else the server's (--webhook-url), else none."""
        return self._by_owner.get(owner, self._default)

    @property
    def enabled(self) -> bool:
        return bool(self._by_owner) or self._default is not None

    def retry_delay(self, attempts: int) -> float:
        """Seconds from a failed attempt (the `attempts`-th) to the next one."""
        base = self.settings.webhook_retry_base_seconds
        return float(
            min(base * 2 ** min(attempts - 1, 40), self.settings.webhook_retry_max_delay_seconds)
        )

    # -- events ---------------------------------------------------------------------------

    def enqueue(self, s: Session, batch: Batch) -> WebhookDelivery | None:
        """Queue the event for `batch`'s final status, in the caller's (the runner's)
        transaction; nothing when the owner has no endpoint."""
        endpoint = self.endpoint_for(batch.owner)
        event_type = EVENT_TYPES.get(batch.status)
        if endpoint is None or event_type is None:
            return None
        created = now()
        event_id = new_id("evt_")
        payload = {
            "id": event_id,
            "object": "event",
            "type": event_type,
            "created_at": created,
            "data": {"id": batch.id},
        }
        row = WebhookDelivery(
            id=new_id("whd_"),
            event_id=event_id,
            event_type=event_type,
            batch_id=batch.id,
            owner=batch.owner,
            url=endpoint.url,
            payload_json=json.dumps(payload, separators=(",", ":")),
            created_at=created,
            next_attempt_at=time.time(),
        )
        s.add(row)
        self._thread.wake()
        return row

    def deliveries(self, batch_id: str, owner: str) -> list[WebhookDelivery]:
        with self.db.read() as s:
            return list(
                s.exec(
                    select(WebhookDelivery)
                    .where(WebhookDelivery.batch_id == batch_id, WebhookDelivery.owner == owner)
                    .order_by(col(WebhookDelivery.created_ns))
                ).all()
            )

    def redeliver(self, delivery_id: str, owner: str) -> WebhookDelivery:
        """Send the same event again now, whatever became of it before."""
        with self.db.write() as s:
            row = s.get(WebhookDelivery, delivery_id)
            if row is None or row.owner != owner:
                raise not_found("webhook delivery", delivery_id, param="delivery_id")
            row.status = DeliveryStatus.PENDING
            row.next_attempt_at = time.time()
            s.add(row)
        self._thread.wake()
        return row

    # -- delivery ------------------------------------------------------------------------

    def start(self) -> None:
        """Send due deliveries from a thread of their own. A node with no endpoint configured
        never starts it, so it never claims (and spends attempts of) another node's events."""
        if not self.enabled:
            return
        self._http = httpx.Client(
            timeout=SEND_TIMEOUT,
            follow_redirects=False,
            headers={"user-agent": f"batchyard/{__version__} (webhooks)"},
        )
        self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        self._thread.stop(timeout)
        if self._http is not None:
            self._http.close()

    def _send_all_due(self) -> None:
        """The delivery thread's step: send passes until nothing is due (or stopping)."""
        while self.send_due() and not self._thread.stopping:
            pass

    def send_due(self, t: float | None = None) -> int:
        """Claim and send the deliveries due by `t` (default: now); returns how many."""
        t = time.time() if t is None else t
        with self.db.write() as s:
            due = list(
                s.exec(
                    select(WebhookDelivery)
                    .where(
                        WebhookDelivery.status == DeliveryStatus.PENDING,
                        col(WebhookDelivery.next_attempt_at) <= t,
                    )
                    .order_by(col(WebhookDelivery.next_attempt_at))
                    .limit(PASS_LIMIT)
                    .with_for_update(skip_locked=True)
                ).all()
            )
            for row in due:
                row.next_attempt_at = t + CLAIM_SECONDS
                s.add(row)
        for row in due:
            self._attempt(row)
        return len(due)

    def _attempt(self, row: WebhookDelivery) -> None:
        endpoint = self.endpoint_for(row.owner)
        code: int | None = None
        error: str | None = None
        if endpoint is None:
            error = "No webhook endpoint is configured for this batch's owner any more."
        else:
            stamp = int(time.time())
            headers = signing.headers(endpoint.secret, row.event_id, stamp, row.payload_json)
            try:
                assert self._http is not None, "start() first"
                r = self._http.post(row.url, content=row.payload_json.encode(), headers=headers)
                code = r.status_code
                if not 200 <= code < 300:
                    error = f"HTTP {code}: {r.text[:ERROR_TEXT]}"
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"[:ERROR_TEXT]
        self._record(row.id, code, error)

    def _record(self, delivery_id: str, code: int | None, error: str | None) -> None:
        t = time.time()
        with self.db.write() as s:
            row = s.get(WebhookDelivery, delivery_id)
            if row is None:
                return
            row.attempts += 1
            row.last_attempt_at = int(t)
            row.last_status_code = code
            row.last_error = error
            if error is None:
                row.status = DeliveryStatus.DELIVERED
                row.delivered_at = int(t)
                row.next_attempt_at = None
            else:
                retry_at = t + self.retry_delay(row.attempts)
                # The event's time is kept in whole seconds: the window is counted in them.
                window_end = row.created_at + self.settings.webhook_retry_window_seconds
                if int(retry_at) > window_end:
                    row.status = DeliveryStatus.FAILED
                    row.next_attempt_at = None
                else:
                    row.next_attempt_at = retry_at
            s.add(row)
        log.info(
            "webhook=%s event=%s batch=%s attempt=%d status=%s code=%s",
            delivery_id,
            row.event_id,
            row.batch_id,
            row.attempts,
            row.status,
            code,
        )
