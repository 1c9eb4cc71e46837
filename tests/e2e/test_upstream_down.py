"""An upstream that is down holds its lines: a real upstream `batchyard serve` is stopped in
the middle of a batch for longer than the front's retry budget, then started again on the
same port. The batch waits for it (its 24 h window is what ends lines, not the outage) and
completes with every line once and none failed; the front shows the engine down meanwhile.
"""

from __future__ import annotations

import time
from pathlib import Path

from openai import OpenAI

from tests.live import OUTPUT, free_port, start_server, stop_server
from tests.metrics import scrape, value
from tests.upstream_double import (
    UPSTREAM_MODEL,
    assert_every_line_once,
    counting_batch,
    upstream_model_args,
)
from tests.waiting import until

#: Two lines in flight when the upstream goes, ten waiting behind them.
LINES = 12
#: retries=1: the front gives up on a request after 0.5 s of backoff.
RETRY_BUDGET_S = 0.5


def test_a_batch_waits_for_its_upstream_to_come_back(tmp_path: Path) -> None:
    port = free_port()
    upstream_args = [*upstream_model_args(tmp_path), "--parallel", "2"]
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
                f"up=openai:{upstream.api},models={UPSTREAM_MODEL},concurrency=2,retries=1",
            ],
        )
        c = OpenAI(base_url=front.api, api_key="unused", max_retries=0, timeout=60)
        batch_id = counting_batch(c, LINES)

        stop_server(upstream)  # down mid-batch
        until(
            lambda: up(front.url), 30, "the front to see its upstream down", accept=lambda v: v == 0
        )
        time.sleep(4 * RETRY_BUDGET_S)  # well past the retry budget of every line it held
        held = c.batches.retrieve(batch_id)
        assert held.status == "in_progress", held
        assert held.request_counts is not None
        assert held.request_counts.failed == 0, held.request_counts
        assert held.request_counts.completed < LINES
        waiting = scrape(front.url)  # the queue's health shows the lines it holds
        assert value(waiting, "batchyard_engine_pending_lines", engine="up") > 0
        assert value(waiting, "batchyard_engine_oldest_pending_seconds", engine="up") > 0

        upstream = start_server(tmp_path / "upstream", log, port=port, args=upstream_args)
        assert_every_line_once(c, batch_id, LINES)
        assert up(front.url) == 1
    finally:
        if front is not None:
            stop_server(front)
        stop_server(upstream)


def up(url: str) -> float:
    return value(scrape(url), "batchyard_engine_up", engine="up")
