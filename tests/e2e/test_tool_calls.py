"""Function tools on chat completions through the openai SDK, on the real model: required,
named, none and auto, a second turn with the tool's result, streaming, a batch line
(vLLM's run-batch tool line), and the 400s."""

from __future__ import annotations

import io
import json
from typing import Any

import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletion

from tests.factories import CHAT, jsonl, jsonl_lines
from tests.http_helpers import FINISHED, wait_for_status
from tests.live import LiveServer

MODEL = "gpt-4o-mini"
CITY = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now."}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
#: The call `{"name": "get_weather", "arguments": {"city": "Paris"}}` is 18 tokens; a little slack.
CALL_TOKENS = 20


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> OpenAI:
    return OpenAI(api_key="unused", base_url=live_server.api, max_retries=0)


def ask(client: OpenAI, **kw: Any) -> ChatCompletion:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "tools": [CITY, TIME],
        "temperature": 0,
        "max_tokens": CALL_TOKENS,
        **kw,
    }
    return client.chat.completions.create(**body)


def the_call(answer: ChatCompletion) -> Any:
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    return call


def test_required_answers_with_a_parsed_call(client: OpenAI) -> None:
    call = the_call(ask(client, tool_choice="required"))
    assert call.function.name in ("get_weather", "get_time")
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert isinstance(args.get("city"), str) and set(args) == {"city"}


def test_a_named_function_is_the_one_called(client: OpenAI) -> None:
    call = the_call(
        ask(client, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    )
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)


def test_none_answers_in_text(client: OpenAI) -> None:
    answer = ask(client, tool_choice="none", max_tokens=6)
    choice = answer.choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")


def test_auto_answers_a_call_or_text_never_a_broken_call(client: OpenAI) -> None:
    answer = ask(client, tool_choice="auto")
    choice = answer.choices[0]
    if choice.finish_reason == "tool_calls":
        the_call(answer)
    else:
        assert choice.message.tool_calls is None and choice.message.content
        assert not choice.message.content.lstrip().startswith("{") or (
            choice.finish_reason == "length"
        )


def test_the_tool_result_goes_back_in_the_next_turn(client: OpenAI) -> None:
    call = the_call(
        ask(client, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    )
    messages: list[Any] = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "22 degrees C and sunny"},
    ]
    answer = ask(client, messages=messages, tool_choice="none", max_tokens=8)
    assert answer.choices[0].message.content and answer.choices[0].message.tool_calls is None
    assert answer.usage is not None and answer.usage.prompt_tokens > 20


def test_a_streamed_call_comes_as_tool_call_deltas(client: OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK,  # type: ignore[arg-type]
        tools=[CITY],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_tokens=CALL_TOKENS,
        stream=True,
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [t for d in deltas for t in d.tool_calls or []]
    assert len(calls) == 1 and calls[0].id and calls[0].function
    assert calls[0].function.name == "get_weather"
    assert isinstance(json.loads(calls[0].function.arguments or "")["city"], str)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "launch"}}}, "tool_choice"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
        ({"tools": openai.NOT_GIVEN, "tool_choice": "required"}, "tool_choice"),
        ({"tools": [CITY], "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_what_the_engine_cannot_honour_is_a_400(
    client: OpenAI, kw: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, **kw)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param  # type: ignore[index]


def test_a_streamed_request_with_a_bad_tool_is_a_400_not_a_stream(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, tool_choice={"type": "function", "function": {"name": "launch"}}, stream=True)
    assert caught.value.body["param"] == "tool_choice"  # type: ignore[index]


#: vLLM's run-batch tool line (tests/entrypoints/openai/test_run_batch.py), model renamed.
VLLM_TOOL_LINE = {
    "custom_id": "request-tool",
    "method": "POST",
    "url": CHAT,
    "body": {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the weather in Dallas, Texas?"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_current_weather",
                    "description": "Get the current weather in a given location",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "city": {
                                "type": "string",
                                "description": "The city to find the weather for, e.g. 'Vienna'",
                            },
                            "state": {
                                "type": "string",
                                "description": "the two-letter abbreviation for the state that "
                                "the city is in, e.g. 'CA' which would mean 'California'",
                            },
                            "unit": {
                                "type": "string",
                                "description": "The unit to fetch the temperature in",
                                "enum": ["celsius", "fahrenheit"],
                            },
                        },
                        "required": ["city", "state", "unit"],
                    },
                },
            }
        ],
        "tool_choice": "required",
        "max_tokens": 40,  # the call is 37 tokens
        "temperature": 0,
    },
}


def test_vllm_tool_line_in_a_batch_comes_back_as_a_call(client: OpenAI) -> None:
    buf = io.BytesIO(jsonl(VLLM_TOOL_LINE))
    buf.name = "tools.jsonl"
    f = client.files.create(file=buf, purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    b = wait_for_status(client.batches.retrieve, b.id, FINISHED, 300)
    assert b.status == "completed" and b.output_file_id
    (line,) = jsonl_lines(client.files.content(b.output_file_id).text)
    body = ChatCompletion.model_validate(line["response"]["body"])
    call = the_call(body)
    assert call.function.name == "get_current_weather"
    args = json.loads(call.function.arguments)
    assert set(args) == {"city", "state", "unit"} and args["unit"] in ("celsius", "fahrenheit")
