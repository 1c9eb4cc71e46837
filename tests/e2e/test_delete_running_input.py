"""Delete like OpenAI: the input file of a running batch is deleted, the server restarts, and
the batch still finishes every line; the bytes go once no batch needs them."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from openai import OpenAI

from tests.factories import batch_line, jsonl, jsonl_texts
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import OUTPUT, start_server, stop_server
from tests.waiting import until

pytestmark = pytest.mark.slow

LINES = 12
ARGS = ["--parallel", "1"]  # one line at a time: the batch is still running at the restart


def test_delete_mid_batch_then_restart_finishes_every_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log = OUTPUT / "delete-running-input.log"
    lines = [
        batch_line(f"d{i:02d}", f"Count from {i} to {i + 30}.", max_tokens=8, temperature=0)
        for i in range(LINES)
    ]
    server = start_server(data, log, args=ARGS)
    try:
        client = OpenAI(api_key="unused", base_url=server.api, max_retries=0)
        f = client.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
        b = client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        wait_for_status(client.batches.retrieve, b.id, ("in_progress",), 120)
        deleted = client.files.delete(f.id)
        assert deleted.deleted is True and deleted.id == f.id
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(f.id)
        assert f.id not in [x.id for x in client.files.list()]
        at_restart = client.batches.retrieve(b.id)
    finally:
        stop_server(server)
    assert at_restart.status == "in_progress", "the batch ended before the restart"
    assert at_restart.request_counts and at_restart.request_counts.completed < LINES
    stored = data / "files" / f.id
    assert stored.is_file()

    server = start_server(data, log, args=ARGS)
    try:
        client = OpenAI(api_key="unused", base_url=server.api, max_retries=0)
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(f.id)
        done = wait_for_status(client.batches.retrieve, b.id, FINISHED, 300)
        assert done.status == "completed", done
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
        assert done.output_file_id
        out = jsonl_texts(client.files.content(done.output_file_id).text)
        assert len(out) == LINES
        until(lambda: not stored.exists(), 10, "the deleted input's bytes to go with its batch")
    finally:
        stop_server(server)
