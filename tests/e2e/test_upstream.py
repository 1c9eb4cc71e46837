"""Upstream engines: a front `batchyard serve --engine ...` in front of a second, real
`batchyard serve` (an OpenAI-compatible server), with the official openai SDK as the client.

Routing by `model` (batch lines and online requests, streaming too), /v1/models listing every
engine's models, an upstream's 4xx as the line's error, retries on connection errors and 5xx,
backoff on 429 with Retry-After, per-engine /metrics and the engines page.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import httpx
import openai
import pytest
from openai import OpenAI
from openai.types import Batch, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import FINISHED, sdk_batch, wait_for_status
from tests.live import OUTPUT, start_server, stop_server
from tests.metrics import scrape, value
from tests.upstream_double import FLAKY_BACKOFF_S, FLAKY_MODEL, UPSTREAM_MODEL, Fleet

EMBEDDED_MODEL = "SmolLM2-135M-Instruct.Q4_1"


def client(fleet: Fleet) -> OpenAI:
    return OpenAI(base_url=fleet.front.api, api_key="unused", max_retries=0, timeout=120)


def run_batch(c: OpenAI, lines: list[dict]) -> tuple[Batch, list[dict], list[dict]]:
    """Upload, create, wait; the batch, its output lines and its error lines."""
    f = c.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
    b = c.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    b = wait_for_status(c.batches.retrieve, b.id, FINISHED, 240, poll=0.3)
    out = c.files.content(b.output_file_id).text if b.output_file_id else ""
    err = c.files.content(b.error_file_id).text if b.error_file_id else ""
    return b, jsonl_lines(out), jsonl_lines(err)


def upstream_chat_posts(fleet: Fleet) -> float:
    samples = scrape(fleet.upstream.url)
    return sum(
        v
        for n, lab, v in samples
        if n == "batchyard_http_requests_total"
        and lab.get("route") == "/v1/chat/completions"
        and lab.get("method") == "POST"
    )


def test_models_lists_every_engines_models(fleet: Fleet) -> None:
    c = client(fleet)
    ids = [m.id for m in c.models.list().data]
    assert ids[0] == EMBEDDED_MODEL
    assert UPSTREAM_MODEL in ids and FLAKY_MODEL in ids
    assert len(ids) == len(set(ids))
    assert c.models.retrieve(UPSTREAM_MODEL).id == UPSTREAM_MODEL
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("no-such-model")
    health = httpx.get(fleet.front.url + "/health").json()
    engines = {e["name"]: e for e in health["engines"]}
    assert engines["embedded"]["models"] == [EMBEDDED_MODEL]
    assert engines["up"]["up"] and UPSTREAM_MODEL in engines["up"]["models"]


def test_batch_lines_go_by_model_to_the_upstream_or_the_embedded_engine(fleet: Fleet) -> None:
    c = client(fleet)
    before = upstream_chat_posts(fleet)
    remote = [
        batch_line(f"r-{i}", f"Say {i}", model=UPSTREAM_MODEL, max_tokens=4) for i in range(4)
    ]
    b, out, err = run_batch(c, remote)
    assert b.status == "completed", b
    assert b.request_counts.completed == 4 and b.request_counts.failed == 0 and not err
    assert sorted(x["custom_id"] for x in out) == [f"r-{i}" for i in range(4)]
    for line in out:
        assert line["response"]["status_code"] == 200
        body = ChatCompletion.model_validate(line["response"]["body"])
        assert body.model == UPSTREAM_MODEL  # written by the upstream
    assert upstream_chat_posts(fleet) - before == 4  # each line once

    local = [batch_line(f"l-{i}", "Hi", model="gpt-4o-mini", max_tokens=4) for i in range(2)]
    b, out, err = run_batch(c, local)
    assert b.status == "completed" and not err
    assert {x["response"]["body"]["model"] for x in out} == {EMBEDDED_MODEL}
    assert upstream_chat_posts(fleet) - before == 4  # none of these went upstream

    samples = scrape(fleet.front.url)
    assert value(samples, "batchyard_engine_completion_tokens_total", engine="up") >= 4
    assert value(samples, "batchyard_engine_completion_tokens_total", engine="embedded") >= 2
    assert value(samples, "batchyard_engine_slots", engine="up") == 4
    assert value(samples, "batchyard_engine_up", engine="up") == 1
    for name in ("in_flight", "queue_depth", "tokens_per_second", "errors_total"):
        assert value(samples, f"batchyard_engine_{name}", engine="up") >= 0


def test_an_upstream_batch_does_not_wait_behind_a_big_embedded_one(fleet: Fleet) -> None:
    """Each engine has its own room in the queue. On one shared room (twice the front's
    10 slots) the upstream's lines would wait until all but 20 of the older batch's lines
    had run on the embedded engine, although the upstream was idle."""
    c = client(fleet)
    total = 120
    big_lines = [
        batch_line(f"big-{i}", f"Tell a story about {i}", model=EMBEDDED_MODEL, max_tokens=24)
        for i in range(total)
    ]
    big = sdk_batch(c, big_lines)
    try:
        wait_for_status(c.batches.retrieve, big.id, {"in_progress", *FINISHED}, 60)
        remote = [batch_line(f"r-{i}", "Hi", model=UPSTREAM_MODEL, max_tokens=4) for i in range(4)]
        b, out, err = run_batch(c, remote)
        behind = c.batches.retrieve(big.id)
    finally:
        c.batches.cancel(big.id)
        wait_for_status(c.batches.retrieve, big.id, FINISHED, 120, poll=0.3)
    assert b.status == "completed" and not err
    assert sorted(x["custom_id"] for x in out) == [f"r-{i}" for i in range(4)]
    assert {x["response"]["body"]["model"] for x in out} == {UPSTREAM_MODEL}
    assert behind.status == "in_progress", behind.status
    assert behind.request_counts.completed < total - 20, behind.request_counts


def test_online_requests_are_proxied_streaming_included(fleet: Fleet) -> None:
    c = client(fleet)
    whole = c.chat.completions.create(
        model=UPSTREAM_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert whole.model == UPSTREAM_MODEL and whole.usage and whole.usage.completion_tokens > 0
    chunks = list(
        c.chat.completions.create(
            model=UPSTREAM_MODEL,
            messages=[{"role": "user", "content": "Count to three"}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(isinstance(ch, ChatCompletionChunk) for ch in chunks)
    assert {ch.model for ch in chunks} == {UPSTREAM_MODEL}
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert any(ch.choices and ch.choices[0].finish_reason for ch in chunks)
    done = c.completions.create(model=UPSTREAM_MODEL, prompt="Once upon", max_tokens=3)
    assert done.model == UPSTREAM_MODEL
    resp = c.responses.create(model=UPSTREAM_MODEL, input="Hi", max_output_tokens=16)
    assert resp.model == UPSTREAM_MODEL and resp.status in ("completed", "incomplete")
    events = list(
        c.responses.create(model=UPSTREAM_MODEL, input="Hi", max_output_tokens=16, stream=True)
    )
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert events[-1].response.model == UPSTREAM_MODEL
    emb = c.embeddings.create(model=UPSTREAM_MODEL, input=["a", "b"])
    assert isinstance(emb, CreateEmbeddingResponse) and emb.model == UPSTREAM_MODEL
    assert len(emb.data) == 2


def test_an_upstream_4xx_is_the_lines_error_and_the_callers(fleet: Fleet) -> None:
    c = client(fleet)
    with pytest.raises(openai.BadRequestError) as caught:
        c.chat.completions.create(
            model=UPSTREAM_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=-5
        )
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == "max_tokens"  # the upstream's own error body
    with pytest.raises(openai.BadRequestError) as caught:  # streamed: the same status
        c.chat.completions.create(
            model=UPSTREAM_MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=-5,
            stream=True,
        )
    assert caught.value.body["param"] == "max_tokens"
    lines = [
        batch_line("bad", "Hi", model=UPSTREAM_MODEL, max_tokens=-5),
        batch_line("good", "Hi", model=UPSTREAM_MODEL, max_tokens=3),
    ]
    b, out, err = run_batch(c, lines)
    assert b.status == "completed"
    assert b.request_counts.completed == 1 and b.request_counts.failed == 1
    assert [x["custom_id"] for x in out] == ["good"]
    assert [x["custom_id"] for x in err] == ["bad"]
    response = err[0]["response"]
    assert response["status_code"] == 400
    assert response["body"]["error"]["param"] == "max_tokens"
    assert response["body"]["error"]["code"] == "invalid_value"
    assert "max_tokens" in response["body"]["error"]["message"]


def test_connection_errors_and_5xx_are_retried_and_each_line_recorded_once(fleet: Fleet) -> None:
    c = client(fleet)
    before = value(scrape(fleet.front.url), "batchyard_upstream_retries_total", engine="flaky")
    fleet.double.plan("drop", "500", "502")
    answer = c.chat.completions.create(
        model=FLAKY_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
    )
    assert answer.choices[0].message.content is not None
    assert [a.answer for a in fleet.double.arrivals] == ["drop", "500", "502", "forward"]
    online_resent = [a for a in fleet.double.arrivals if a.answer == "drop" and a.reused]

    fleet.double.plan("500", "drop", "503", "500")
    lines = [batch_line(f"f-{i}", "Hi", model=FLAKY_MODEL, max_tokens=3) for i in range(3)]
    b, out, err = run_batch(c, lines)
    batch_arrivals = list(fleet.double.arrivals)
    assert b.status == "completed" and not err, err
    assert sorted(x["custom_id"] for x in out) == ["f-0", "f-1", "f-2"]  # once each
    assert b.request_counts.completed == 3 and b.request_counts.total == 3
    forwarded = [a for a in fleet.double.arrivals if a.answer == "forward"]
    assert len(forwarded) == 3 and len(fleet.double.arrivals) == 7
    # Every scripted failure is a retry, but a drop on a kept-alive connection, which the
    # client's pool sends again at once as it would after an idle close (http1.py).
    resent = [a for a in batch_arrivals if a.answer == "drop" and a.reused]
    after = value(scrape(fleet.front.url), "batchyard_upstream_retries_total", engine="flaky")
    assert after - before == 7 - len(online_resent) - len(resent), (online_resent, resent)


def test_too_many_failures_end_as_the_lines_error(fleet: Fleet) -> None:
    c = client(fleet)
    fleet.double.plan(*["500"] * 5)  # the first try and retries=4 more
    with pytest.raises(openai.InternalServerError) as caught:
        c.chat.completions.create(
            model=FLAKY_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
        )
    assert caught.value.status_code == 500
    assert len(fleet.double.arrivals) == 5
    # The waits between the tries follow `flaky`'s backoff=: 0.2 s, doubling each time
    # (the default 0.5 s would have spaced five tries 7.5 s apart).
    at = [a.at for a in fleet.double.arrivals]
    gaps = [later - earlier for earlier, later in itertools.pairwise(at)]
    assert all(gap >= 0.9 * FLAKY_BACKOFF_S * 2**i for i, gap in enumerate(gaps)), gaps
    assert at[-1] - at[0] < 7.5, gaps


def test_429_with_retry_after_waits_and_backs_off(fleet: Fleet) -> None:
    c = client(fleet)
    fleet.double.plan("429:2")
    t0 = time.monotonic()
    answer = c.chat.completions.create(
        model=FLAKY_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
    )
    assert answer.choices
    first, second = fleet.double.arrivals
    assert (first.answer, second.answer) == ("429:2", "forward")
    assert second.at - first.at >= 1.9  # Retry-After: 2 was honoured
    assert time.monotonic() - t0 >= 1.9
    samples = scrape(fleet.front.url)
    assert value(samples, "batchyard_upstream_throttled_total", engine="flaky") >= 1


def test_the_engines_page_shows_each_engine(fleet: Fleet) -> None:
    page = httpx.get(fleet.front.url + "/engines", timeout=10)
    assert page.status_code == 200
    html = page.text
    for text in (
        "embedded",
        'data-engine="up"',
        'data-engine="flaky"',
        UPSTREAM_MODEL,
        FLAKY_MODEL,
    ):
        assert text in html
    assert fleet.upstream.api in html
    assert "Tokens/s" in html and "Queue depth" in html and "In flight" in html
    models = httpx.get(fleet.front.url + "/models", timeout=10)  # the embedded engine's models
    assert models.status_code == 200 and "<h1>Models</h1>" in models.text


def test_upstreams_only_answer_404_for_other_models(fleet: Fleet, tmp_path: Path) -> None:
    server = start_server(
        tmp_path / "data",
        OUTPUT / "upstream-only-server.log",
        args=["--no-embedded", "--engine", f"up=openai:{fleet.upstream.api}"],
    )
    try:
        c = OpenAI(base_url=server.api, api_key="unused", max_retries=0)
        assert [m.id for m in c.models.list().data] == [UPSTREAM_MODEL]
        answer = c.chat.completions.create(
            model=UPSTREAM_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert answer.model == UPSTREAM_MODEL
        with pytest.raises(openai.NotFoundError) as caught:
            c.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
            )
        assert caught.value.code == "model_not_found"
        b, out, err = run_batch(c, [batch_line("x", "Hi", model="gpt-4o", max_tokens=2)])
        assert b.request_counts.failed == 1 and not out
        assert err[0]["response"]["status_code"] == 404
        assert err[0]["response"]["body"]["error"]["code"] == "model_not_found"
        health = httpx.get(server.url + "/health").json()
        assert health["status"] == "ready" and [e["name"] for e in health["engines"]] == ["up"]
    finally:
        stop_server(server)
