"""An upstream that is down holds its lines: a real upstream `batchyard serve` is stopped in
the middle of a batch for longer than the front's retry budget, then started again on the
same port. The batch waits for it (its 24 h window is what ends lines, not the outage) and
completes with every line once and none failed; the front shows the engine down meanwhile.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from openai import OpenAI

from app.config import default_model_path
from tests.factories import batch_line, jsonl
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import OUTPUT, free_port, start_server, stop_server
from tests.metrics import scrape, value
from tests.upstream_double import UPSTREAM_MODEL
from tests.waiting import until

LINES = 24
#: retries=2: the front gives up on a request after 0.5 + 1 s of backoff.
RETRY_BUDGET_S = 1.5


def test_a_batch_waits_for_its_upstream_to_come_back(tmp_path: Path) -> None:
    model = tmp_path / f"{UPSTREAM_MODEL}.gguf"
    model.symlink_to(default_model_path())
    port = free_port()
    upstream_args = ["--model", str(model), "--parallel", "2"]
    log = OUTPUT / "upstream-down-upstream.log"
    upstream = start_server(tmp_path / "upstream", log, port=port, args=upstream_args)
    front = None
    try:
        front = start_server(
            tmp_path / "front",
            OUTPUT / "upstream-down-front.log",
            args=[
                "--no-embedded",
                "--engine",
                f"up=openai:{upstream.api},models={UPSTREAM_MODEL},concurrency=2,retries=2",
            ],
        )
        c = OpenAI(base_url=front.api, api_key="unused", max_retries=0, timeout=60)
        lines = [
            batch_line(f"line-{i}", f"Count to {i}.", model=UPSTREAM_MODEL, max_tokens=12)
            for i in range(LINES)
        ]
        f = c.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
        b = c.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        until(
            lambda: c.batches.retrieve(b.id).request_counts,
            120,
            "the first lines to finish",
            accept=lambda n: n is not None and n.completed >= 2,
            poll=0.05,
        )

        stop_server(upstream)  # down mid-batch
        until(
            lambda: up(front.url), 30, "the front to see its upstream down", accept=lambda v: v == 0
        )
        time.sleep(4 * RETRY_BUDGET_S)  # well past the retry budget of every line it held
        held = c.batches.retrieve(b.id)
        assert held.status == "in_progress", held
        assert held.request_counts is not None
        assert held.request_counts.failed == 0, held.request_counts
        assert held.request_counts.completed < LINES
        waiting = scrape(front.url)  # the queue's health shows the lines it holds
        assert value(waiting, "batchyard_engine_pending_lines", engine="up") > 0
        assert value(waiting, "batchyard_engine_oldest_pending_seconds", engine="up") > 0

        upstream = start_server(tmp_path / "upstream", log, port=port, args=upstream_args)
        done = wait_for_status(c.batches.retrieve, b.id, FINISHED, 180, poll=0.3)
        assert done.status == "completed", done
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0)
        assert done.error_file_id is None
        assert done.output_file_id is not None
        out = [json.loads(x) for x in c.files.content(done.output_file_id).text.splitlines()]
        assert sorted(x["custom_id"] for x in out) == sorted(f"line-{i}" for i in range(LINES))
        assert all(x["response"]["status_code"] == 200 for x in out)
        assert up(front.url) == 1
    finally:
        if front is not None:
            stop_server(front)
        stop_server(upstream)


def up(url: str) -> float:
    return value(scrape(url), "batchyard_engine_up", engine="up")
