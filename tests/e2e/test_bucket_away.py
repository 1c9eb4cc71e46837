"""A bucket that goes away holds its lines: a `batchyard serve` keeps its files in a real
SeaweedFS (`--files-url s3://`) and feeds the fixed-latency upstream (harness/upstream.py); the
SeaweedFS is stopped in the middle of the batch for longer than the S3 client's retries,
then started again on the same ports and data. Lines whose input could not be read while it
was away wait in the queue (as lines wait for an upstream that is down) and the batch
completes, every line once and none failed.

Each line carries a long prompt, so that the input file spans several of the runner's
read-ahead blocks (app/files/s3.py's READ_AHEAD_BYTES) and lines must be read from the
bucket while it is away, not from a block read before.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from openai import OpenAI

from app.files.s3 import READ_AHEAD_BYTES
from harness.seaweed import seaweed_server
from harness.upstream import MODEL, start_upstream
from tests.factories import batch_line, jsonl
from tests.http_helpers import sdk_batch, until_lines_completed
from tests.live import OUTPUT, start_server, stop_process, stop_server
from tests.upstream_double import assert_every_line_once

pytestmark = pytest.mark.slow

LINES = 300
PROMPT_BYTES = 16_000
#: 8 lines at a time, 100 ms each: the batch outlasts the outage, and its lines reach the
#: next read-ahead block within a second or two of the bucket going away.
LATENCY_MS = 100
#: Longer than the S3 client's retries of one read (bucket.py: 3, 0.1 s backoff).
AWAY_S = 4.0


def test_a_batch_waits_for_its_bucket_to_come_back(tmp_path: Path) -> None:
    (tmp_path / "weed").mkdir()
    with seaweed_server(tmp_path / "weed", OUTPUT / "bucket-away-seaweed.log") as weed:
        if isinstance(weed, str):
            pytest.skip(weed)
        proc, upstream = start_upstream(LATENCY_MS)
        front = None
        try:
            front = start_server(
                tmp_path / "node",
                OUTPUT / "bucket-away-server.log",
                env=weed.env(),
                args=[
                    "--files-url",
                    f"s3://{weed.bucket}/away",
                    "--s3-endpoint",
                    weed.endpoint,
                    "--no-embedded",
                    "--engine",
                    f"fast=openai:{upstream}/v1,models={MODEL},concurrency=8",
                ],
            )
            c = OpenAI(base_url=front.api, api_key="unused", max_retries=0, timeout=60)
            pad = "x" * PROMPT_BYTES
            body = [
                batch_line(f"line-{i}", f"{i} {pad}", model=MODEL, max_tokens=1)
                for i in range(LINES)
            ]
            assert len(jsonl(*body)) > 4 * READ_AHEAD_BYTES
            b = sdk_batch(c, body)
            until_lines_completed(c, b.id, 10, 60)

            weed.stop(kill=True)  # the bucket goes away mid-batch (SIGTERM takes ~10 s)
            time.sleep(AWAY_S)
            held = c.batches.retrieve(b.id)
            assert held.status == "in_progress", held
            assert held.request_counts is not None
            assert held.request_counts.failed == 0, held.request_counts
            assert held.request_counts.completed < LINES
            assert "input unreadable, waiting for the store" in front.log()

            assert weed.start() is None  # back, on the same ports and data
            assert_every_line_once(c, b.id, LINES)
        finally:
            if front is not None:
                stop_server(front)
            stop_process(proc)
