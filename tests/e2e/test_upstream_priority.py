"""`priority=on` on an upstream lane: each batch line it sends carries vLLM's and SGLang's
`priority`, from its batch's deadline (app/batches/claims/claims.py: line_priority), and online
requests carry none. The front (`batchyard serve --no-embedded`) feeds a recording HTTP
server (tests/upstream_double.py) that forwards to the fixed-latency upstream
(harness/upstream.py); the bodies it received are read back."""

from __future__ import annotations

import json
from pathlib import Path

from openai import OpenAI

from harness.upstream import MODEL, start_upstream
from tests.factories import batch_line, jsonl
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import OUTPUT, start_server, stop_process, stop_server
from tests.upstream_double import FlakyUpstream


def test_batch_lines_carry_their_deadlines_priority_and_online_requests_none(
    tmp_path: Path,
) -> None:
    proc, upstream = start_upstream(5)
    double = FlakyUpstream(upstream)
    front = None
    try:
        front = start_server(
            tmp_path / "front",
            OUTPUT / "upstream-priority-server.log",
            args=[
                "--no-embedded",
                "--engine",
                f"up=openai:{double.api},models={MODEL},concurrency=4,priority=on",
            ],
        )
        c = OpenAI(base_url=front.api, api_key="unused", max_retries=0, timeout=60)
        ids = {}
        for window in ("1h", "24h", "7d"):
            body = [
                batch_line(f"{window}-{i}", f"{window} {i}", model=MODEL, max_tokens=1)
                for i in range(5)
            ]
            f = c.files.create(file=("in.jsonl", jsonl(*body)), purpose="batch")
            ids[window] = c.batches.create(
                input_file_id=f.id,
                endpoint="/v1/chat/completions",
                completion_window=window,  # type: ignore[arg-type]  # the SDK's type says "24h"
            ).id
        for batch_id in ids.values():
            done = wait_for_status(c.batches.retrieve, batch_id, FINISHED, 60, poll=0.1)
            assert done.status == "completed" and done.request_counts.completed == 5  # type: ignore[union-attr]
        sent = [json.loads(a.body) for a in double.arrivals if a.body]
        by_window: dict[str, set[int]] = {}
        for body in sent:
            window = body["messages"][-1]["content"].split()[0]
            by_window.setdefault(window, set()).add(body["priority"])
        # k while the minutes left are under 2**k: 59 minutes -> 6, 1,439 -> 11, 10,079 -> 14.
        assert by_window == {"1h": {6}, "24h": {11}, "7d": {14}}

        double.plan()  # forget the batch's arrivals
        online = c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1
        )
        assert online.choices[0].message.content == "A"
        (arrival,) = [a for a in double.arrivals if a.body]
        assert "priority" not in json.loads(arrival.body)
    finally:
        if front is not None:
            stop_server(front)
        double.close()
        stop_process(proc)
