"""Batch usage sums and request ids, through the openai SDK on a live server and the real model."""

from __future__ import annotations

import io
import json

import pytest
from openai import OpenAI

from tests.factories import batch_line, jsonl
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import LiveServer

#: A long system prompt every line shares, so the engine's prefix cache has something to hit.
SYSTEM = "You are a terse assistant for a shipping company. " + " ".join(
    f"Rule {i}: answer in one short sentence about parcels and crates." for i in range(14)
)


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> OpenAI:
    return OpenAI(api_key="unused", base_url=live_server.api, max_retries=0)


def test_batch_cached_tokens_are_the_sum_of_its_lines(client: OpenAI) -> None:
    lines = [
        {
            **batch_line(f"c{i}", f"Where is parcel {i}?", max_tokens=4, temperature=0),
            "body": {
                "model": "m",
                "max_tokens": 4,
                "temperature": 0,
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"Where is parcel {i}?"},
                ],
            },
        }
        for i in range(8)
    ]
    buf = io.BytesIO(jsonl(*lines))
    buf.name = "cached.jsonl"
    f = client.files.create(file=buf, purpose="batch")
    b = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait_for_status(client.batches.retrieve, b.id, FINISHED, 300)
    assert done.status == "completed" and done.output_file_id
    out = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert len(out) == 8
    usages = [line["response"]["body"]["usage"] for line in out]
    line_cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert line_cached > 0, usages
    assert done.usage is not None
    assert done.usage.input_tokens_details.cached_tokens == line_cached
    assert done.usage.input_tokens == sum(u["prompt_tokens"] for u in usages)
