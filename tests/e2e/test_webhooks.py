"""Webhooks as OpenAI sends them, to a real HTTP receiver, checked by the SDK's unwrap():
a failed delivery is retried with the same event id, across a restart of the server."""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI
from openai.types.webhooks import BatchCompletedWebhookEvent

from tests.factories import batch_line, jsonl
from tests.http_helpers import wait_for_status
from tests.live import OUTPUT, start_server, stop_server
from tests.receiver import webhook_receiver
from tests.waiting import until

pytestmark = pytest.mark.slow

SECRET = "whsec_" + base64.b64encode(b"batchyard-test-secret-0123456789").decode()


def deliveries(data: Path) -> list[dict[str, Any]]:
    con = sqlite3.connect(data / "batchyard.db")
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM webhookdelivery").fetchall()]
    finally:
        con.close()


def test_a_failed_delivery_is_retried_with_the_same_event_across_a_restart(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    log = OUTPUT / "webhooks.log"
    # The first retry comes 2 s after the failure (5 s by default): the server stops at
    # once (a fraction of a second), and its next start sends the retry.
    env = {"BATCHYARD_WEBHOOK_RETRY_BASE_SECONDS": "2"}
    args = ["--webhook-url", "", "--webhook-secret", SECRET]
    with webhook_receiver([500]) as receiver:
        args[1] = receiver.url
        server = start_server(data, log, env=env, args=args)
        try:
            client = OpenAI(api_key="unused", base_url=server.api, max_retries=0)
            f = client.files.create(
                file=("hook.jsonl", jsonl(batch_line("h1", "Hi", max_tokens=4))), purpose="batch"
            )
            b = client.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            wait_for_status(client.batches.retrieve, b.id, ("completed",), 120)
            (first,) = receiver.wait_for(1)
        finally:
            stop_server(server)
        assert first.answered == 500
        event = client.webhooks.unwrap(first.body, first.headers, secret=SECRET)
        assert isinstance(event, BatchCompletedWebhookEvent)
        assert event.type == "batch.completed" and event.data.id == b.id
        assert event.id.startswith("evt_") and event.object == "event"
        assert first.headers["webhook-id"] == event.id
        (stored,) = deliveries(data)
        assert stored["status"] == "pending" and stored["attempts"] == 1
        assert stored["last_status_code"] == 500 and stored["event_id"] == event.id

        server = start_server(data, log, env=env, args=args)
        try:
            _, second = receiver.wait_for(2)
            again = client.webhooks.unwrap(second.body, second.headers, secret=SECRET)
            assert again.id == event.id and second.body == first.body
            assert second.answered == 200
            with httpx.Client(base_url=server.url, timeout=30) as http:
                page = wait_for_page(http, b.id, "delivered")
                assert '<td class="attempts">2</td>' in page
                (stored,) = deliveries(data)
                assert stored["status"] == "delivered" and stored["attempts"] == 2
                assert stored["last_status_code"] == 200
                # Redeliver from the dashboard: the same event once more.
                r = http.post(f"/web/webhooks/{stored['id']}/redeliver")
                assert r.status_code == 200 and stored["event_id"] in r.text
                _, _, third = receiver.wait_for(3)
            assert client.webhooks.unwrap(third.body, third.headers, secret=SECRET).id == event.id
            with pytest.raises(Exception, match="signature"):
                client.webhooks.unwrap(third.body, third.headers, secret="whsec_" + "QUFB" * 8)
        finally:
            stop_server(server)
        assert len(receiver.received) == 3


def wait_for_page(http: httpx.Client, batch_id: str, text: str, timeout: float = 20) -> str:
    return until(
        lambda: http.get(f"/batches/{batch_id}").text,
        timeout,
        f"{text!r} on batch {batch_id}'s page",
        accept=lambda page: text in page,
        poll=0.2,
    )
