"""The batch page's webhook deliveries in a real browser: a failed delivery shows its 500,
and the Redeliver button sends the same event again (htmx), which then shows as delivered."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI
from playwright.sync_api import Page, expect

from tests.factories import batch_line, jsonl
from tests.http_helpers import batch_getter, create_batch, upload, wait_for_status
from tests.live import OUTPUT, LiveServer, start_server, stop_server
from tests.receiver import Receiver, webhook_receiver

SECRET = "whsec_" + base64.b64encode(b"browser-webhook-secret-000000000").decode()


@pytest.fixture
def hooked(tmp_path: Path) -> Iterator[tuple[LiveServer, Receiver]]:
    with webhook_receiver([500]) as receiver:
        server = start_server(
            tmp_path / "data",
            OUTPUT / "browser-webhooks.log",
            # An hour before the automatic retry: only the button sends it again.
            env={"BATCHYARD_WEBHOOK_RETRY_BASE_SECONDS": "3600"},
            args=["--webhook-url", receiver.url, "--webhook-secret", SECRET],
        )
        try:
            yield server, receiver
        finally:
            stop_server(server)


def test_redeliver_from_the_batch_page(page: Page, hooked: tuple[LiveServer, Receiver]) -> None:
    server, receiver = hooked
    with server.http() as http:
        f = upload(http, jsonl(batch_line("w", "Hi", max_tokens=2)), name="hook.jsonl")
        b = create_batch(http, f["id"])
        wait_for_status(batch_getter(http), b["id"], ("completed",), 120)
    (first,) = receiver.wait_for(1)
    page.goto(f"{server.url}/batches/{b['id']}")
    row = page.locator("table.deliveries tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_have_attribute("data-status", "pending")
    expect(row).to_contain_text("batch.completed")
    expect(row).to_contain_text("500")
    expect(row.locator(".attempts")).to_have_text("1")
    row.get_by_role("button", name="Redeliver").click()
    expect(row).to_have_attribute("data-status", "delivered", timeout=20_000)
    expect(row.locator(".attempts")).to_have_text("2")
    _, second = receiver.wait_for(2)
    sdk = OpenAI(api_key="unused", base_url=server.api)
    assert (
        sdk.webhooks.unwrap(second.body, second.headers, secret=SECRET).id
        == (first.headers["webhook-id"])
    )
