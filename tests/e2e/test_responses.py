"""`/v1/responses` through the openai SDK on the real model: create, streamed create,
`responses.stream`, function tools over two turns, prefix-cache hits in usage, a batch
with endpoint /v1/responses, and the 400s. Shapes are checked with openai's own types."""

from __future__ import annotations

import io
import json
from typing import Any

import openai
import pytest
from openai import OpenAI
from openai.types.responses import Response

from tests.factories import jsonl, jsonl_lines
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import LiveServer

MODEL = "gpt-4.1-mini"
RESPONSES = "/v1/responses"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
#: A call `{"name": "get_weather", "arguments": {"city": "Oslo"}}` takes 21-22 tokens.
CALL_TOKENS = 28
#: `{"ok": true}` or `{"ok": false}` then the end: a short answer that always completes.
YES_NO = {
    "type": "json_schema",
    "name": "yes_no",
    "schema": {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    },
    "strict": True,
}


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> OpenAI:
    return OpenAI(api_key="unused", base_url=live_server.api, max_retries=0)


def test_create_answers_a_response_object(client: OpenAI) -> None:
    r = client.responses.create(
        model=MODEL,
        instructions="Answer in one short sentence.",
        input="Name a colour.",
        max_output_tokens=6,
        temperature=0,
        top_p=0.9,
        store=False,
        metadata={"run": "test"},
    )
    Response.model_validate(r.model_dump())
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete") and r.output_text
    assert r.instructions == "Answer in one short sentence." and r.max_output_tokens == 6
    assert r.metadata == {"run": "test"} and r.temperature == 0 and r.top_p == 0.9
    assert r.usage is not None and 0 < r.usage.output_tokens <= 6
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    if r.status == "incomplete":
        assert r.incomplete_details is not None
        assert r.incomplete_details.reason == "max_output_tokens"


def test_a_repeated_prefix_is_reported_as_cached_input_tokens(client: OpenAI) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "instructions": "You are a terse assistant for a test of the prefix cache. " * 4,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say yes."}]}],
        "max_output_tokens": 2,
        "temperature": 0,
    }
    client.responses.create(**body)
    again = client.responses.create(**body)
    assert again.usage is not None
    cached = again.usage.input_tokens_details.cached_tokens
    # Everything but the last prompt token comes from the cache the first request left.
    assert again.usage.input_tokens - 8 <= cached < again.usage.input_tokens


def test_streamed_create_is_the_sdk_event_sequence(client: OpenAI) -> None:
    events = list(
        client.responses.create(
            model=MODEL, input="Say hello.", max_output_tokens=4, temperature=0, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert "response.output_text.delta" in kinds
    assert kinds[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == deltas and final.usage is not None
    assert final.usage.output_tokens <= 4 and final.id == events[0].response.id  # type: ignore[union-attr]


def test_responses_stream_with_a_json_schema_gets_the_final_response(client: OpenAI) -> None:
    with client.responses.stream(
        model=MODEL,
        input="Is the sky blue?",
        text={"format": YES_NO},  # type: ignore[typeddict-item]
        max_output_tokens=12,
        temperature=0,
    ) as stream:
        final = stream.get_final_response()
    assert final.status == "completed"
    assert isinstance(json.loads(final.output_text)["ok"], bool)


def test_function_tools_over_two_turns(client: OpenAI) -> None:
    ask: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.responses.create(
        model=MODEL,
        input=ask,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=CALL_TOKENS,
        temperature=0,
    )
    Response.model_validate(first.model_dump())
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id.startswith("call_") and first.status == "completed"
    assert isinstance(json.loads(call.arguments)["city"], str)
    second = client.responses.create(
        model=MODEL,
        input=[
            *ask,
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": "22 C, sunny"},
        ],
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="none",
        max_output_tokens=6,
        temperature=0,
    )
    assert second.output[0].type == "message" and second.output_text


def test_a_named_function_streamed(client: OpenAI) -> None:
    with client.responses.stream(
        model=MODEL,
        input="Weather in Rome?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=CALL_TOKENS,
        temperature=0,
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    (call,) = final.output
    assert call.type == "function_call" and json.loads(call.arguments)["city"]


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"extra_body": {"frequency_penalty": 1}}, "frequency_penalty"),
        ({"temperature": 3}, "temperature"),
        ({"text": {"format": {"type": "xml"}}}, "text.format"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].image_url",  # the default model takes no images
        ),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(
    client: OpenAI, kw: dict[str, Any], param: str
) -> None:
    body = {"model": MODEL, "input": "Hi", "max_output_tokens": 2, **kw}
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(**body, stream=stream)
        assert caught.value.body["param"] == param  # type: ignore[index]


def test_a_model_that_does_not_reason_takes_reasoning_and_ignores_it(client: OpenAI) -> None:
    r = client.responses.create(
        model=MODEL, input="Hi", max_output_tokens=2, reasoning={"effort": "high"}
    )
    assert [item.type for item in r.output] == ["message"]
    assert r.reasoning is not None and r.reasoning.effort == "high"
    assert r.usage is not None and r.usage.output_tokens_details.reasoning_tokens == 0


def test_a_batch_for_v1_responses_answers_response_objects(client: OpenAI) -> None:
    def line(cid: str, **body: Any) -> dict[str, Any]:
        return {
            "custom_id": cid,
            "method": "POST",
            "url": RESPONSES,
            "body": {"model": MODEL, "max_output_tokens": 4, "temperature": 0, **body},
        }

    lines = [
        line("text", input="Name a fruit."),
        line("call", input="Weather in Oslo?", tools=[WEATHER], tool_choice="required",
             max_output_tokens=CALL_TOKENS),
        line("bad", input="Hi", previous_response_id="resp_1"),
    ]  # fmt: skip
    buf = io.BytesIO(jsonl(*lines))
    buf.name = "responses.jsonl"
    f = client.files.create(file=buf, purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint=RESPONSES, completion_window="24h")
    assert b.endpoint == RESPONSES
    b = wait_for_status(client.batches.retrieve, b.id, FINISHED, 300)
    assert b.status == "completed" and b.request_counts is not None
    assert (b.request_counts.completed, b.request_counts.failed) == (2, 1)
    assert b.output_file_id and b.error_file_id
    out = {x["custom_id"]: x for x in jsonl_lines(client.files.content(b.output_file_id).text)}
    text = Response.model_validate(out["text"]["response"]["body"])
    assert text.output_text and text.usage is not None and text.usage.output_tokens <= 4
    call = Response.model_validate(out["call"]["response"]["body"])
    assert call.output[0].type == "function_call" and call.output[0].name == "get_weather"
    (err,) = jsonl_lines(client.files.content(b.error_file_id).text)
    assert err["custom_id"] == "bad" and err["response"]["status_code"] == 400
    assert err["response"]["body"]["error"]["param"] == "previous_response_id"
    assert b.usage is not None and b.usage.input_tokens > 0 and b.usage.output_tokens > 0
