"""`service_tier` on the online endpoints, through the openai SDK on the real model:
`flex` runs at batch priority and its answer says `flex`; `auto` and `default` run as
online requests do and say `default`; any other tier is a 400 that lists the allowed ones.
A flex request sent while a batch fills the engine waits its turn among the batch lines,
so a default request sent after it is answered first. A batch line, chat or Responses,
takes the same tiers and is refused for the same ones."""

from __future__ import annotations

import threading
import time
from typing import Any

import openai
import pytest
from openai import OpenAI

from tests.factories import batch_line, jsonl, jsonl_lines
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import LiveServer

MODEL = "gpt-4.1-mini"
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
def sdk(live_server: LiveServer) -> OpenAI:
    return OpenAI(base_url=live_server.api, api_key="unused", max_retries=0, timeout=300)


def test_the_answer_names_the_tier_it_ran_at(sdk: OpenAI) -> None:
    for asked, named in (("flex", "flex"), ("default", "default"), ("auto", "default")):
        chat = sdk.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=4,
            service_tier=asked,  # type: ignore[arg-type]
        )
        assert chat.service_tier == named and chat.choices[0].message.content
        resp = sdk.responses.create(
            model=MODEL,
            input="Say hello.",
            max_output_tokens=16,
            service_tier=asked,  # type: ignore[arg-type]
        )
        assert resp.service_tier == named and resp.output_text
    plain = sdk.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4)
    assert plain.service_tier is None  # none asked, none named: as before
    chunks = list(
        sdk.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=4, stream=True, service_tier="flex"
        )
    )
    assert chunks and {c.service_tier for c in chunks} == {"flex"}


@pytest.mark.parametrize("path", ["chat", "responses"])
def test_an_unknown_tier_is_a_400_listing_the_allowed_ones(sdk: OpenAI, path: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        if path == "chat":
            sdk.chat.completions.create(
                model=MODEL, messages=HELLO, max_tokens=4, service_tier="priority"
            )
        else:
            sdk.responses.create(model=MODEL, input="Hi.", service_tier="priority")
    err: Any = caught.value.body
    assert caught.value.status_code == 400
    assert err["param"] == "service_tier" and err["code"] == "invalid_value"
    assert "'auto', 'default', 'flex'" in err["message"]


def test_a_flex_request_waits_its_turn_behind_the_batch_lines(sdk: OpenAI) -> None:
    # Enough batch lines, long enough, to keep every slot and the engine's queue busy.
    lines = [
        batch_line(f"l{i}", f"Write a long story about the number {i}.", max_tokens=96)
        for i in range(40)
    ]
    f = sdk.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
    b = sdk.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    try:
        deadline = time.monotonic() + 120
        while (sdk.batches.retrieve(b.id).request_counts or _none()).completed < 1:
            assert time.monotonic() < deadline, "the batch did not start"
            time.sleep(0.1)
        answered: list[str] = []

        def ask(tier: str) -> None:
            r = sdk.chat.completions.create(
                model=MODEL,
                messages=HELLO,
                max_tokens=4,
                service_tier=tier,  # type: ignore[arg-type]
            )
            assert r.service_tier == tier
            answered.append(tier)

        flex = threading.Thread(target=ask, args=("flex",))
        flex.start()
        time.sleep(0.3)
        ask("default")  # sent after the flex one, answered before it
        flex.join(300)
        assert answered == ["default", "flex"]
    finally:
        sdk.batches.cancel(b.id)


@pytest.mark.parametrize("url", ["/v1/chat/completions", "/v1/responses"])
def test_a_batch_line_takes_the_tiers_the_online_endpoint_takes(sdk: OpenAI, url: str) -> None:
    def line(cid: str, tier: str) -> dict[str, Any]:
        if url == "/v1/responses":
            body = {"input": "Say hello.", "max_output_tokens": 16}
        else:
            body = {"messages": HELLO, "max_tokens": 4}
        return {"custom_id": cid, "method": "POST", "url": url,
                "body": {"model": MODEL, "service_tier": tier, **body}}  # fmt: skip

    tiers = ("flex", "auto", "default", "priority")
    f = sdk.files.create(file=("in.jsonl", jsonl(*(line(t, t) for t in tiers))), purpose="batch")
    b = sdk.batches.create(input_file_id=f.id, endpoint=url, completion_window="24h")  # type: ignore[arg-type]
    b = wait_for_status(sdk.batches.retrieve, b.id, FINISHED, 300)
    assert b.status == "completed" and b.request_counts is not None
    assert (b.request_counts.completed, b.request_counts.failed) == (3, 1)
    assert b.output_file_id and b.error_file_id
    out = jsonl_lines(sdk.files.content(b.output_file_id).text)
    assert sorted(x["custom_id"] for x in out) == ["auto", "default", "flex"]
    (err,) = jsonl_lines(sdk.files.content(b.error_file_id).text)
    assert err["custom_id"] == "priority" and err["response"]["status_code"] == 400
    error = err["response"]["body"]["error"]
    assert error["param"] == "service_tier" and error["code"] == "invalid_value"
    assert "'auto', 'default', 'flex'" in error["message"]


def _none() -> Any:
    return type("Counts", (), {"completed": 0})()
