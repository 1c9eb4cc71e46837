"""The webhooks' delivery thread on a real SQLite file, sending to a real HTTP receiver."""

from __future__ import annotations

import base64
from pathlib import Path

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
