"""Earliest deadline first within fair shares, through the openai SDK: a real `batchyard
serve` with two API keys and the embedded model.

Key A's 24-hour batch of 2,000 lines is running when key A creates a 1-hour batch: the
1-hour batch takes key A's share and completes while the big one moves by little more than
the lines it already held (app/batches/claims/claims.py). With both keys doing the same, each
key's 1-hour batch completes first, and both 24-hour batches keep moving afterwards.
"""

from __future__ import annotations

import time
from pathlib import Path

from openai import OpenAI

from tests.factories import batch_line, jsonl
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import OUTPUT, start_server, stop_server
from tests.waiting import until

BIG = 2000
SMALL = 24
PARALLEL = 4  # a room of 8 lines


def submit(c: OpenAI, prefix: str, n: int, window: str) -> str:
    lines = [batch_line(f"{prefix}-{i}", f"Say {i}.", max_tokens=4) for i in range(n)]
    f = c.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
    return c.batches.create(
        input_file_id=f.id,
        endpoint="/v1/chat/completions",
        completion_window=window,  # type: ignore[arg-type]  # the SDK's type says "24h"
    ).id


def claimable(c: OpenAI, batch_id: str) -> None:
    """Wait until the batch is validated: its lines may be claimed from then on."""
    until(lambda: c.batches.retrieve(batch_id).status != "validating", 60, "validation", poll=0.02)


def done(c: OpenAI, batch_id: str) -> int:
    counts = c.batches.retrieve(batch_id).request_counts
    return counts.completed + counts.failed if counts else 0


def test_an_owners_one_hour_batch_goes_before_its_own_24_hour_one(tmp_path: Path) -> None:
    server = start_server(
        tmp_path / "data",
        OUTPUT / "deadlines-server.log",
        args=["--api-key", "key-a", "--api-key", "key-b", "--parallel", str(PARALLEL)],
    )
    try:
        a = OpenAI(base_url=server.api, api_key="key-a", max_retries=0, timeout=60)
        b = OpenAI(base_url=server.api, api_key="key-b", max_retries=0, timeout=60)
        big = submit(a, "a", BIG, "24h")
        until(lambda: done(a, big) >= 4, 120, "key A's big batch to be running", poll=0.05)
        t0 = time.monotonic()
        urgent = submit(a, "h", SMALL, "1h")
        # Counted from when its lines may be claimed: while the file validates, the big
        # batch goes on as it should (on a loaded machine, for a second or more).
        claimable(a, urgent)
        before = done(a, big)
        finished = wait_for_status(a.batches.retrieve, urgent, FINISHED, 180, poll=0.1)
        took, moved = time.monotonic() - t0, done(a, big) - before
        print(f"\n1-hour batch of {SMALL}: {took:.1f} s; the 24-hour one moved {moved} meanwhile")
        assert finished.status == "completed", finished
        assert finished.expires_at - finished.created_at == 3600
        # The lines it held when the urgent batch came (a room of 2 x PARALLEL), and few more.
        assert moved < SMALL / 2, moved

        # Two owners, each with a 24-hour batch running and a 1-hour batch behind it.
        other = submit(b, "b", BIG, "24h")
        until(lambda: done(b, other) >= 4, 120, "key B's big batch to be running", poll=0.05)
        t0 = time.monotonic()
        urgents = {big: submit(a, "ha", SMALL, "1h"), other: submit(b, "hb", SMALL, "1h")}
        claimable(a, urgents[big])
        claimable(b, urgents[other])
        marks = {big: done(a, big), other: done(b, other)}
        # Each owner's 24-hour batch, measured when that owner's 1-hour batch is done (then
        # the owner's share goes back to it).
        moved: dict[str, int] = {}
        while len(moved) < 2:
            assert time.monotonic() - t0 < 240, moved
            for client, long in ((a, big), (b, other)):
                if long not in moved:
                    now_done = done(client, long)
                    if client.batches.retrieve(urgents[long]).status in FINISHED:
                        moved[long] = now_done - marks[long]
            time.sleep(0.1)
        took = time.monotonic() - t0
        for client, long in ((a, big), (b, other)):
            ended = client.batches.retrieve(urgents[long])
            assert ended.status == "completed", ended
        print(f"both 1-hour batches: {took:.1f} s; the 24-hour ones moved {list(moved.values())}")
        assert all(n < SMALL / 2 for n in moved.values()), moved
        # Neither owner starves after: both big batches keep moving.
        marks = {big: done(a, big), other: done(b, other)}
        until(
            lambda: done(a, big) > marks[big] + 4 and done(b, other) > marks[other] + 4,
            120,
            "both 24-hour batches to move on",
            poll=0.2,
        )
        for client, batch_id in ((a, big), (b, other)):
            client.batches.cancel(batch_id)  # the rest would only take the suite's time
            wait_for_status(client.batches.retrieve, batch_id, FINISHED, 60, poll=0.2)
    finally:
        stop_server(server)
