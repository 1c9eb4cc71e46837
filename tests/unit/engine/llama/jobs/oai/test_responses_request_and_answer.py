"""/v1/responses without a model: the body -> chat translation, its 400s, and the `response`
object and stream events checked against openai's own types."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from app.engine.base import EngineError, Priority
from app.engine.llama.jobs.jobs import Choice, Job
from app.engine.llama.jobs.oai import answers, responses_request
from app.engine.llama.jobs.oai.chat_template import ChatTemplate
from app.engine.llama.jobs.prepare import Preparer
from app.web.views import answer_text
from app.wire.endpoints import RESPONSES
from tests.unit.engine.llama.jobs.test_prepare import Letters

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def test_a_string_input_with_instructions_becomes_system_and_user() -> None:
    chat, state = responses_request.to_chat(
        {
            "model": "m",
            "input": "Hi",
            "instructions": "Be brief.",
            "max_output_tokens": 8,
            "temperature": 0,
            "top_p": 0.5,
            "store": False,
        }
    )
    assert chat == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
        ],
        "temperature": 0,
        "top_p": 0.5,
        "max_completion_tokens": 8,
    }
    assert state.echo["instructions"] == "Be brief." and state.echo["max_output_tokens"] == 8


def test_items_with_calls_and_results_become_the_chat_turns() -> None:
    chat, _ = responses_request.to_chat(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "get_weather",
                    "arguments": '{"city": "Paris"}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "22 C"},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "It is 22 C.", "annotations": []}],
                },
            ],
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": False,
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        }
    )
    assert chat["messages"] == [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
        {"role": "assistant", "content": "It is 22 C."},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {k: WEATHER[k] for k in ("name", "description", "parameters")},
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert chat["parallel_tool_calls"] is False
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}},
    }


def test_reasoning_items_effort_and_include_are_taken() -> None:
    chat, state = responses_request.to_chat(
        {
            "model": "m",
            "include": ["reasoning.encrypted_content"],
            "reasoning": {"effort": "low", "summary": "auto"},
            "input": [
                {"role": "user", "content": "q"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "because"}],
                },
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "more"},
            ],
        }
    )
    # The thought goes with the assistant turn after it; the effort runs as chat's.
    assert chat["messages"][1] == {
        "role": "assistant",
        "content": "a",
        "reasoning_content": "because",
    }
    assert chat["reasoning_effort"] == "low"
    assert state.reasoning == {"effort": "low", "summary": "auto"}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
        ({"reasoning": {"summary": "long"}}, "reasoning.summary"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"frequency_penalty": 1}, "frequency_penalty"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"metadata": {"k": 1}}, "metadata"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0].image_url",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": []}, "input"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_parameter(
    extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(EngineError) as caught:
        responses_request.to_chat({"model": "m", "input": "Hi", **extra})
    assert caught.value.status_code == 400 and caught.value.param == param


def prepared(body: dict[str, Any], ctx: int = 4096) -> Job:
    job = Job(RESPONSES, {"model": "m", **body}, Priority.ONLINE, None)
    template = ChatTemplate(None, "", "<|im_end|>")
    preparer = Preparer(Letters(), template, ctx_per_slot=ctx, n_slots=2, embedding_dim=8)
    preparer.prepare(job, itertools.count())
    return job


def test_chat_path_errors_come_back_in_the_responses_names() -> None:
    cases = [
        ({"input": "Hi", "temperature": 5}, "temperature"),
        ({"input": "Hi", "text": {"format": {"type": "xml"}}}, "text.format"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        (
            {"input": "Hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "f"}},
            "tool_choice",
        ),
        ({"input": "Hi", "tools": [{**WEATHER, "name": "a b"}]}, "tools[0].name"),
    ]
    for body, param in cases:
        with pytest.raises(EngineError) as caught:
            prepared(body)
        assert caught.value.param == param, (body, caught.value.message)
    with pytest.raises(EngineError) as caught:
        prepared({"input": "Hi", "max_output_tokens": 60}, ctx=64)
    assert caught.value.param == "max_output_tokens"
    assert caught.value.code == "context_length_exceeded"


def finish(job: Job, text: str, reason: str = "stop") -> Job:
    job.cached_tokens = 2
    job.choices = [Choice(0, text=text, completion_tokens=4, finish_reason=reason)]
    return job


def test_the_response_object_has_a_message_and_usage_with_cached_tokens() -> None:
    job = finish(prepared({"input": "Hi", "instructions": "Brief.", "metadata": {"k": "v"}}), "Hey")
    body = Response.model_validate(answers.completion(job, "model-x", "fp"))
    assert body.id.startswith("resp_") and body.status == "completed" and body.model == "model-x"
    assert body.output_text == "Hey" and body.instructions == "Brief."
    assert body.metadata == {"k": "v"} and body.completed_at is not None
    assert body.usage is not None
    assert body.usage.input_tokens == len(job.prompts[0]) and body.usage.output_tokens == 4
    assert body.usage.input_tokens_details.cached_tokens == 2
    assert body.usage.output_tokens_details.reasoning_tokens == 0
    assert body.usage.total_tokens == body.usage.input_tokens + 4
    cut = finish(prepared({"input": "Hi", "max_output_tokens": 4}), "Hey th", "length")
    body = Response.model_validate(answers.completion(cut, "m", "fp"))
    assert body.status == "incomplete" and body.incomplete_details is not None
    assert body.incomplete_details.reason == "max_output_tokens"


CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def test_a_call_is_a_function_call_item() -> None:
    job = finish(
        prepared({"input": "Weather?", "tools": [WEATHER], "tool_choice": "required"}), CALL
    )
    body = Response.model_validate(answers.completion(job, "m", "fp"))
    (item,) = body.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert item.call_id.startswith("call_") and json.loads(item.arguments) == {"city": "Paris"}
    assert body.tools[0].type == "function" and body.tool_choice == "required"


def events_of(job: Job, pieces: list[str]) -> list[Any]:
    choice = job.choices[0]
    final_text, choice.text = choice.text, ""
    out = []
    for piece in pieces:
        choice.text += piece
        out += answers.choice_chunks(job, choice, piece, "m", "fp")
    assert choice.text == final_text
    out += answers.choice_chunks(job, choice, None, "m", "fp")
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return [EVENTS.validate_python(e) for e in out]


def test_a_streamed_message_is_the_sdk_event_sequence() -> None:
    job = finish(prepared({"input": "Hi"}), "Hello there")
    events = events_of(job, ["Hello", " there"])
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert events[6].text == "Hello there"
    final = events[-1].response
    assert final.output_text == "Hello there" and final.id == events[0].response.id
    assert final.output[0].id == events[2].item.id
    # The non-streamed body of the same job is that final response.
    whole = Response.model_validate(answers.completion(job, "m", "fp"))
    assert whole.output == final.output


def test_a_streamed_call_is_the_function_call_events() -> None:
    job = finish(prepared({"input": "Weather?", "tools": [WEATHER]}), CALL)
    events = events_of(job, [CALL[:5], CALL[5:]])
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert json.loads(events[4].arguments) == {"city": "Paris"}
    assert events[5].item.call_id == events[-1].response.output[0].call_id
    cut = finish(prepared({"input": "Hi", "max_output_tokens": 2}), "Hey", "length")
    assert events_of(cut, ["Hey"])[-1].type == "response.incomplete"


def test_the_dashboard_preview_shows_a_response_text_and_calls() -> None:
    said = finish(prepared({"input": "Hi"}), "Hello")
    assert answer_text(answers.completion(said, "m", "fp")) == "Hello"
    called = finish(prepared({"input": "Weather?", "tools": [WEATHER]}), CALL)
    assert answer_text(answers.completion(called, "m", "fp")) == 'get_weather({"city": "Paris"})'
    chat = {"choices": [{"message": {"content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
    ]}}]}  # fmt: skip
    assert answer_text(chat) == 'get_weather({"city": "Oslo"})'
