"""Batch usage sums and request ids, through the openai SDK on a live server and the real model."""

from __future__ import annotations

import io

import httpx
import openai
import pytest
from openai import OpenAI

from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import LiveServer
from tests.waiting import until

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
    out = jsonl_lines(client.files.content(done.output_file_id).text)
    assert len(out) == 8
    usages = [line["response"]["body"]["usage"] for line in out]
    line_cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert line_cached > 0, usages
    assert done.usage is not None
    assert done.usage.input_tokens_details.cached_tokens == line_cached
    assert done.usage.input_tokens == sum(u["prompt_tokens"] for u in usages)


def test_a_responses_batch_sums_input_tokens_details_the_same_way(client: OpenAI) -> None:
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {
                "model": "m",
                "instructions": SYSTEM,
                "input": f"Where is crate {i}?",
                "max_output_tokens": 4,
                "temperature": 0,
            },
        }
        for i in range(4)
    ]
    buf = io.BytesIO(jsonl(*lines))
    buf.name = "cached-responses.jsonl"
    f = client.files.create(file=buf, purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/responses", completion_window="24h")
    done = wait_for_status(client.batches.retrieve, b.id, FINISHED, 300)
    assert done.status == "completed" and done.output_file_id, done
    out = jsonl_lines(client.files.content(done.output_file_id).text)
    usages = [line["response"]["body"]["usage"] for line in out]
    line_cached = sum(u["input_tokens_details"]["cached_tokens"] for u in usages)
    assert line_cached > 0, usages
    assert done.usage is not None
    assert done.usage.input_tokens_details.cached_tokens == line_cached
    assert done.usage.input_tokens == sum(u["input_tokens"] for u in usages)
    assert done.usage.output_tokens == sum(u["output_tokens"] for u in usages)


def test_every_response_carries_an_x_request_id_that_the_log_names(
    client: OpenAI, live_server: LiveServer
) -> None:
    page = client.files.list()
    assert page._request_id is not None  # type: ignore[attr-defined]
    models = client.models.list()
    assert models._request_id and models._request_id.startswith("req_")  # type: ignore[attr-defined]
    raw = client.files.with_raw_response.list()
    assert raw.request_id and raw.request_id.startswith("req_")
    assert raw.request_id != models._request_id  # type: ignore[attr-defined]

    with pytest.raises(openai.NotFoundError) as missing:
        client.files.retrieve("file-nope")
    assert missing.value.request_id and missing.value.request_id.startswith("req_")
    with pytest.raises(openai.BadRequestError) as bad:
        client.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert bad.value.request_id and bad.value.request_id != missing.value.request_id

    with httpx.Client(base_url=live_server.url, timeout=30) as http:
        seen = {
            path: http.get(path, headers={"X-Request-Id": "mine"})
            for path in ("/", "/files", "/v1/nowhere", "/static/app.css", "/health")
        }
        seen["POST /v1/batches (bad json)"] = http.post(
            "/v1/batches", content=b"{", headers={"content-type": "application/json"}
        )
    for what, r in seen.items():
        rid = r.headers.get("x-request-id", "")
        assert rid.startswith("req_") and len(rid) == 36, (what, r.headers)
    assert seen["/v1/nowhere"].status_code == 404

    wanted = [
        f"request_id={rid}"
        for rid in (
            raw.request_id,
            missing.value.request_id,
            seen["/v1/nowhere"].headers["x-request-id"],
        )
    ]
    # The server logs through a queue: its lines reach the file a moment after the answer.
    log = until(
        live_server.log,
        10,
        f"the log to name {wanted}",
        accept=lambda log: all(w in log for w in wanted),
        poll=0.1,
    )
    line = next(x for x in log.splitlines() if wanted[1] in x)
    assert "path=/v1/files/file-nope status=404 " in line
