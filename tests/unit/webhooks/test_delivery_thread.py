"""The webhooks' delivery thread on a real SQLite file, sending to a real HTTP receiver."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
from sqlmodel import select

from app.tables import DeliveryStatus, WebhookDelivery
from tests.factories import batch_line
from tests.fakes import FakeEngine
from tests.receiver import webhook_receiver
from tests.unit.helpers import drive, make_batch, services

SECRET = "whsec_" + base64.b64encode(b"unit-test-secret" * 4).decode()


def test_a_batch_that_ends_wakes_the_delivery_thread_and_stop_ends_it(tmp_path: Path) -> None:
    with webhook_receiver() as receiver:
        svc = services(
            tmp_path, FakeEngine(n_slots=1), webhook_url=receiver.url, webhook_secret=SECRET
        )
        # Only the wake from enqueue() can send it in time: the thread's own poll is an hour.
        svc.webhooks._thread.interval = 3600.0
        svc.webhooks.start()
        try:
            bid = make_batch(svc, [batch_line("c0", "q 0")])
            assert drive(svc, bid).status == "completed"
            (got,) = receiver.wait_for(1, timeout=10)
            assert b'"batch.completed"' in got.body and bid.encode() in got.body
        finally:
            svc.webhooks.stop(timeout=10)
        assert not svc.webhooks._thread.alive


def test_the_retry_window_is_counted_in_the_events_whole_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event kept as second C (made at C.99, say) and failing at C+1.5, with a 1 s base and
    a 2 s window: its retry at C+2.5 is within the window's last second, so it is queued; a
    failure at C+2.5 (retry at C+4.5) gives up."""
    svc = services(
        tmp_path,
        FakeEngine(n_slots=1),
        webhook_url="http://127.0.0.1:9/hook",
        webhook_secret=SECRET,
        webhook_retry_base_seconds=1,
        webhook_retry_window_seconds=2,
    )
    bid = make_batch(svc, [batch_line("c0", "q 0")])
    assert drive(svc, bid).status == "completed"
    with svc.db.write() as s:
        (row,) = s.exec(select(WebhookDelivery).where(WebhookDelivery.batch_id == bid)).all()
        created, delivery = row.created_at, row.id

    def record_at(t: float) -> WebhookDelivery:
        monkeypatch.setattr(time, "time", lambda: t)
        svc.webhooks._record(delivery, 500, "boom")
        monkeypatch.undo()
        with svc.db.write() as s:
            got = s.get(WebhookDelivery, delivery)
            assert got is not None
            return got

    first = record_at(created + 1.5)
    assert (first.attempts, first.status) == (1, DeliveryStatus.PENDING), first
    assert first.next_attempt_at == created + 2.5
    second = record_at(created + 2.5)
    assert (second.attempts, second.status) == (2, DeliveryStatus.FAILED), second
    assert second.next_attempt_at is None
