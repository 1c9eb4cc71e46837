"""Fair shares between owners: a real `batchyard serve` with two API keys and the embedded
model. Key A's batch of a few hundred lines is running when key B creates a 10-line batch;
B's batch completes while A's is less than half done (the claim takes turns between owners,
app/batches/claims/claims.py), where before it waited for all of A's lines.
"""

from __future__ import annotations

import time
from pathlib import Path

from openai import OpenAI

from tests.factories import batch_line, jsonl
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import OUTPUT, start_server, stop_server
from tests.waiting import until

A_LINES = 200
B_LINES = 10


def test_a_small_batch_does_not_wait_behind_a_big_one(tmp_path: Path) -> None:
    server = start_server(
        tmp_path / "data",
        OUTPUT / "fair-shares-server.log",
        args=["--api-key", "key-a", "--api-key", "key-b"],
    )
    try:
        a = OpenAI(base_url=server.api, api_key="key-a", max_retries=0, timeout=60)
        b = OpenAI(base_url=server.api, api_key="key-b", max_retries=0, timeout=60)

        def submit(c: OpenAI, prefix: str, n: int) -> str:
            lines = [batch_line(f"{prefix}-{i}", f"Say {i}.", max_tokens=4) for i in range(n)]
            f = c.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
            return c.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            ).id

        big = submit(a, "a", A_LINES)
        until(
            lambda: a.batches.retrieve(big).request_counts,
            120,
            "key A's batch to be running",
            accept=lambda n: n is not None and n.completed >= 4,
            poll=0.05,
        )
        t0 = time.monotonic()
        small = submit(b, "b", B_LINES)
        done = wait_for_status(b.batches.retrieve, small, FINISHED, 120, poll=0.1)
        took = time.monotonic() - t0
        progress = a.batches.retrieve(big).request_counts
        assert progress is not None
        print(
            f"\nkey B's {B_LINES} lines completed {took:.1f} s after they were created, "
            f"with key A's batch at {progress.completed} of {A_LINES}"
        )
        assert done.status == "completed", done
        assert done.request_counts is not None and done.request_counts.completed == B_LINES
        assert progress.completed < A_LINES / 2, progress
        a.batches.cancel(big)  # the rest of A's lines would only take the suite's time
        ended = wait_for_status(a.batches.retrieve, big, FINISHED, 60, poll=0.2)
        assert ended.status == "cancelled", ended
    finally:
        stop_server(server)
