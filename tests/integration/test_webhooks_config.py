"""Webhooks through the app on a real SQLite file, sent to real HTTP receivers: one event
per final status, per-key endpoints over the server's, the retry schedule, bad settings."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from litestar.testing import TestClient
from openai import OpenAI

from app.auth.keys import keys_problem
from app.config import Settings
from app.webhooks.service import WebhookService
from tests.factories import batch_line, jsonl
from tests.fakes import HangingEngine
from tests.http_helpers import MakeClient, batch_getter, create_batch, upload, wait_for_status
from tests.receiver import webhook_receiver
from tests.waiting import until


def secret(seed: str) -> str:
    return "whsec_" + base64.b64encode(seed.encode() * 4).decode()


SERVER_SECRET, KEY_SECRET = secret("server-secret-00"), secret("key-one-secret-0")


def unwrap(body: bytes, headers: dict[str, str], key: str) -> object:
    return OpenAI(api_key="unused", base_url="http://unused").webhooks.unwrap(
        body, headers, secret=key
    )


def test_each_final_status_sends_its_event(make_client: MakeClient) -> None:
    with webhook_receiver() as receiver:
        client = make_client(
            HangingEngine(),
            webhook_url=receiver.url,
            webhook_secret=SERVER_SECRET,
            batch_window_seconds=2,
        )
        get = batch_getter(client)
        done = create_batch(client, upload(client, jsonl(batch_line("a", "hi")))["id"])
        failed = create_batch(client, upload(client, b"not json\n")["id"])
        cancelled = create_batch(client, upload(client, jsonl(batch_line("c", "HANG")))["id"])
        wait_for_status(get, cancelled["id"], ("in_progress",))
        client.post(f"/v1/batches/{cancelled['id']}/cancel")
        expired = create_batch(client, upload(client, jsonl(batch_line("e", "HANG")))["id"])
        for b, status in (
            (done, "completed"),
            (failed, "failed"),
            (cancelled, "cancelled"),
            (expired, "expired"),
        ):
            wait_for_status(get, b["id"], (status,))
        events = [unwrap(r.body, r.headers, SERVER_SECRET) for r in receiver.wait_for(4)]
    by_batch = {e.data.id: e.type for e in events}  # type: ignore[attr-defined]
    assert by_batch == {
        done["id"]: "batch.completed",
        failed["id"]: "batch.failed",
        cancelled["id"]: "batch.cancelled",
        expired["id"]: "batch.expired",
    }
    assert len({e.id for e in events}) == 4  # type: ignore[attr-defined]


def test_a_key_with_its_own_endpoint_gets_its_events_there(
    make_client: MakeClient, tmp_path: Path
) -> None:
    with webhook_receiver() as server_hooks, webhook_receiver() as key_hooks:
        keys = tmp_path / "keys"
        keys.write_text(
            f"# key, then options\nkey-one-aaaa webhook_url={key_hooks.url} "
            f"webhook_secret={KEY_SECRET}\nkey-two-bbbb\n"
        )
        client = make_client(
            api_keys_file=str(keys), webhook_url=server_hooks.url, webhook_secret=SERVER_SECRET
        )
        ids = {}
        for key in ("key-one-aaaa", "key-two-bbbb"):
            auth = {"Authorization": f"Bearer {key}"}
            f = upload(client, jsonl(batch_line("a", "hi")), headers=auth)
            ids[key] = create_batch(client, f["id"], headers=auth)["id"]
            wait_for_status(batch_getter(client, auth), ids[key], ("completed",))
        (own,) = key_hooks.wait_for(1)
        (shared,) = server_hooks.wait_for(1)
        assert unwrap(own.body, own.headers, KEY_SECRET).data.id == ids["key-one-aaaa"]  # type: ignore[attr-defined]
        assert unwrap(shared.body, shared.headers, SERVER_SECRET).data.id == ids["key-two-bbbb"]  # type: ignore[attr-defined]
        # The other key's deliveries are not on this key's batch page.
        page = client.get(
            f"/web/batches/{ids['key-one-aaaa']}/webhooks",
            headers={"Authorization": "Bearer key-two-bbbb"},
        )
        assert own.headers["webhook-id"] not in page.text


def test_the_retry_schedule_doubles_to_an_hour_within_72_hours(tmp_path: Path) -> None:
    settings = Settings(data_dir=str(tmp_path))
    hooks = WebhookService(settings, db=None)  # type: ignore[arg-type]
    delays = [hooks.retry_delay(n) for n in range(1, 14)]
    assert delays[:11] == [5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600]
    assert delays[11:] == [3600, 3600]
    t, attempts = 0.0, 1
    while t + hooks.retry_delay(attempts) <= settings.webhook_retry_window_seconds:
        t += hooks.retry_delay(attempts)
        attempts += 1
    assert attempts == 81 and t > 71 * 3600  # the last try comes 71.4 h after the event


def test_a_delivery_gives_up_when_its_window_is_spent(make_client: MakeClient) -> None:
    """Tries at about +0 s and +2 s fit a 5 s window, however late the first one starts
    within 4 s of the event; a third at +6 s never does."""
    with webhook_receiver([500] * 10) as receiver:
        client = make_client(
            webhook_url=receiver.url,
            webhook_secret=SERVER_SECRET,
            webhook_retry_base_seconds=2,
            webhook_retry_window_seconds=5,
        )
        b = create_batch(client, upload(client, jsonl(batch_line("a", "hi")))["id"])
        wait_for_status(batch_getter(client), b["id"], ("completed",))
        receiver.wait_for(2)
        page = wait_for(client, b["id"], 'data-status="failed"')
    assert len(receiver.received) == 2
    assert "500" in page and '<td class="attempts">2</td>' in page


def wait_for(client: TestClient, batch_id: str, text: str, timeout: float = 15) -> str:
    return until(
        lambda: client.get(f"/web/batches/{batch_id}/webhooks").text,
        timeout,
        f"{text!r} on batch {batch_id}'s webhooks partial",
        accept=lambda page: text in page,
        poll=0.1,
    )


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"webhook_url": "http://x"}, "--webhook-url needs --webhook-secret"),
        ({"webhook_secret": "whsec_???"}, "not base64"),
        ({"webhook_secret": "short"}, "too short"),
    ],
)
def test_bad_webhook_settings_are_refused_naming_the_flag(
    changes: dict[str, str], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        Settings(**changes)  # type: ignore[arg-type]


def test_a_bad_keys_file_line_names_its_line(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("good-key-1234\nother-key-5678 webhook=http://x\n")
    problem = keys_problem(Settings(api_keys_file=str(keys)))
    assert problem and "line 2" in problem and "webhook_url=..." in problem
    keys.write_text("other-key-5678 webhook_url=http://x\n")
    problem = keys_problem(Settings(api_keys_file=str(keys)))
    assert problem and "needs webhook_secret" in problem


def test_a_node_without_an_endpoint_leaves_deliveries_to_the_nodes_that_have_one(
    make_client: MakeClient, tmp_path: Path
) -> None:
    """A worker (or serve) started without --webhook-url shares the queue but never claims
    an event it could not send; the worker takes the same webhook flags as serve."""
    with webhook_receiver([200]) as receiver:
        client = make_client(webhook_url=receiver.url, webhook_secret=SERVER_SECRET)
        b = create_batch(client, upload(client, jsonl(batch_line("a", "hi")))["id"])
        wait_for_status(batch_getter(client), b["id"], ("completed",))
        receiver.wait_for(1)
    bare = WebhookService(Settings(data_dir=str(tmp_path)), db=None)  # type: ignore[arg-type]
    bare.start()
    assert not bare.enabled and not bare._thread.alive
    bare.stop()
    from app.cli import WORKER_FLAGS

    assert {"webhook_url", "webhook_secret", "api_keys_file"} <= set(WORKER_FLAGS)
