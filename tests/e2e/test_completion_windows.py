"""Completion windows through the openai SDK: a `batchyard serve` that allows 1h and 90m
besides 24h, over the fixed-latency upstream of harness/upstream.py (1.5 s an answer, two at
once), so that a batch is still running when its window is made to end.

The window's end is brought forward by writing `expires_at` in the server's SQLite file,
as an hour passing would: the runner expires what is due at its next look.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from harness.upstream import MODEL, start_upstream
from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import FINISHED, until_lines_completed, wait_for_status
from tests.live import OUTPUT, LiveServer, start_server, stop_process, stop_server

LATENCY_MS = 1500
LINES = 10


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    proc, upstream = start_upstream(LATENCY_MS)
    live = None
    try:
        live = start_server(
            tmp_path_factory.mktemp("windows"),
            OUTPUT / "windows-server.log",
            args=[
                "--no-embedded",
                "--engine",
                f"slow=openai:{upstream}/v1,models={MODEL},concurrency=2",
                "--completion-windows",
                "1h,90m",
            ],
        )
        yield live
    finally:
        if live is not None:
            stop_server(live)
        stop_process(proc)


def client(server: LiveServer) -> OpenAI:
    return OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=60)


def input_file(c: OpenAI, lines: int = LINES) -> str:
    body = [batch_line(f"w-{i}", f"Say {i}.", model=MODEL, max_tokens=1) for i in range(lines)]
    return c.files.create(file=("in.jsonl", jsonl(*body)), purpose="batch").id


def test_a_1h_window_sets_expires_at_an_hour_on(server: LiveServer) -> None:
    c = client(server)
    file_id = input_file(c, 2)
    for window, seconds in (("1h", 3600), ("90m", 5400), ("24h", 86400)):
        b = c.batches.create(
            input_file_id=file_id,
            endpoint="/v1/chat/completions",
            completion_window=window,  # type: ignore[arg-type]  # the SDK's type says "24h"
        )
        assert b.completion_window == window
        assert b.expires_at == b.created_at + seconds, (window, b)
        got = c.batches.retrieve(b.id)
        assert (got.completion_window, got.expires_at) == (window, b.expires_at)
    done = wait_for_status(c.batches.retrieve, b.id, FINISHED, 60)
    assert done.status == "completed", done


def test_a_window_not_allowed_is_a_400_that_lists_the_allowed_ones(server: LiveServer) -> None:
    c = client(server)
    file_id = input_file(c, 1)
    for window in ("7d", "2h", "1 hour", ""):
        with pytest.raises(openai.BadRequestError) as caught:
            c.batches.create(
                input_file_id=file_id,
                endpoint="/v1/chat/completions",
                completion_window=window,  # type: ignore[arg-type]
            )
        assert caught.value.status_code == 400
        body = caught.value.body
        assert isinstance(body, dict)
        assert body["param"] == "completion_window" and body["code"] == "invalid_value"
        assert body["message"] == (
            f'Invalid completion_window "{window}". Supported: '
            "'1h', '90m', '24h' (this server's --completion-windows)."
        )


def test_a_batch_past_its_window_ends_expired_with_what_it_did(server: LiveServer) -> None:
    c = client(server)
    b = c.batches.create(
        input_file_id=input_file(c),
        endpoint="/v1/chat/completions",
        completion_window="1h",  # type: ignore[arg-type]
    )
    until_lines_completed(c, b.id, 2, 60)
    # The hour passes: the window ends now.
    ends = int(time.time())
    db = sqlite3.connect(Path(server.data_dir) / "batchyard.db", timeout=30)
    with db:
        db.execute("UPDATE batch SET expires_at = ? WHERE id = ?", (ends, b.id))
    db.close()

    done = wait_for_status(c.batches.retrieve, b.id, FINISHED, 30)
    assert done.status == "expired", done
    assert done.expired_at is not None and done.expired_at >= ends
    counts = done.request_counts
    assert counts is not None and counts.total == LINES
    assert 2 <= counts.completed < LINES and counts.completed + counts.failed == LINES
    assert done.output_file_id is not None and done.error_file_id is not None
    out = jsonl_lines(c.files.content(done.output_file_id).read())
    err = jsonl_lines(c.files.content(done.error_file_id).read())
    assert len(out) == counts.completed and len(err) == counts.failed
    assert all(o["response"]["status_code"] == 200 for o in out)
    for e in err:
        assert e["response"] is None
        assert e["error"]["code"] == "batch_expired"
    ids = sorted(x["custom_id"] for x in out + err)
    assert ids == sorted(f"w-{i}" for i in range(LINES))  # every line once
