"""Function tools without a model: the plan from a chat body, the prompt, the grammar, the
parsed answer, and the chat bodies and stream chunks checked against openai's own types."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from app.engine.base import EngineError, Priority
from app.engine.llama.jobs.jobs import Choice, Job
from app.engine.llama.jobs.oai import answers, tools
from app.engine.llama.jobs.oai.chat_template import ChatTemplate, normalise_messages
from app.engine.llama.jobs.prepare import Preparer
from app.wire.endpoints import CHAT
from tests.unit.engine.llama.jobs.test_prepare import Letters

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def plan(**body: Any) -> tools.ToolPlan | None:
    return tools.parse_tools({"tools": [WEATHER, TIME], **body})


def refused(body: dict[str, Any]) -> EngineError:
    with pytest.raises(EngineError) as caught:
        tools.parse_tools(body)
    assert caught.value.status_code == 400
    return caught.value


def test_tool_choice_forms_become_a_plan() -> None:
    auto = plan()
    assert (
        auto is not None and auto.choice == "auto" and auto.allowed == ["get_weather", "get_time"]
    )
    required = plan(tool_choice="required", parallel_tool_calls=False)
    assert required is not None and required.choice == "required" and not required.parallel
    named = plan(tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert named is not None and (named.choice, named.named, named.allowed) == (
        "required",
        "get_time",
        ["get_time"],
    )
    allowed = plan(
        tool_choice={
            "type": "allowed_tools",
            "allowed_tools": {
                "mode": "required",
                "tools": [{"type": "function", "function": {"name": "get_weather"}}],
            },
        }
    )
    assert allowed is not None and allowed.allowed == ["get_weather"]
    none = plan(tool_choice="none")
    assert none is not None and not none.active
    assert tools.parse_tools({"messages": ASK}) is None
    assert tools.parse_tools({"tools": [], "tool_choice": "auto"}) is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1]"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "f"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"functions": [WEATHER["function"]]}, "functions"),
        ({"tools": "get_weather"}, "tools"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_parameter(
    body: dict[str, Any], param: str
) -> None:
    assert refused(body).param == param


def test_the_system_block_lists_the_functions_and_the_call_format() -> None:
    p = plan(tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert p is not None
    messages = tools.with_tools([{"role": "system", "content": "Be brief."}, *ASK], p)
    assert len(messages) == 2 and messages[0]["content"].startswith("Be brief.\n\n")
    block = messages[0]["content"]
    assert '"name": "get_weather"' in block and '"name": "get_time"' in block
    assert '{"name": <function name>, "arguments":' in block
    assert "You must call the function get_weather" in block
    # No system message: the block becomes one; tool_choice none: no block at all.
    assert tools.with_tools(ASK, plan())[0]["role"] == "system"
    assert tools.with_tools(ASK, plan(tool_choice="none")) == ASK


def test_grammar_required_is_the_calls_auto_adds_text_none_has_none(
    allows: Callable[[str, str], bool],
) -> None:
    weather = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    required = tools.grammar(plan(tool_choice="required"))
    assert required is not None
    assert allows(required, weather) and allows(required, '{"name": "get_time", "arguments": {}}')
    assert not allows(required, "It is sunny.")
    assert not allows(required, '{"name": "get_news", "arguments": {}}')
    named = tools.grammar(plan(tool_choice={"type": "function", "function": {"name": "get_time"}}))
    assert named is not None and not allows(named, weather)
    auto = tools.grammar(plan())
    assert auto is not None
    assert allows(auto, weather) and allows(auto, "It is sunny in Oslo.")
    assert not allows(auto, '{"name": "get_weather"}') and not allows(auto, " {")
    assert tools.grammar(plan(tool_choice="none")) is None
    assert tools.grammar(None) is None


def test_a_call_parses_and_anything_else_is_text() -> None:
    p = plan()
    assert p is not None
    calls = tools.parse_calls(' {"name": "get_weather", "arguments": {"city": "Paris"}}\n', p)
    assert calls is not None and len(calls) == 1
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    for text in (
        "It is sunny.",
        '{"name": "get_weather", "arguments": {"city": "Par',  # cut off by max_tokens
        '{"name": "launch", "arguments": {}}',  # not a function of this request
        '{"name": "get_weather", "arguments": "Paris"}',
        "[1, 2]",
    ):
        assert tools.parse_calls(text, p) is None


def test_earlier_calls_and_tool_results_render_as_plain_turns() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    messages = normalise_messages(
        [
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
        ]
    )
    assert messages[1] == {
        "role": "assistant",
        "content": '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    }
    assert messages[2] == {
        "role": "user",
        "content": "The function get_weather returned: 22 C, sunny",
    }
    with pytest.raises(EngineError) as caught:
        normalise_messages([*ASK, {"role": "tool", "content": "x"}])
    assert caught.value.param == "messages[1].tool_call_id"
    with pytest.raises(EngineError) as caught:
        normalise_messages([{"role": "assistant", "tool_calls": [{"id": "c"}]}])
    assert caught.value.param == "messages[0].tool_calls[0]"


def prepared(body: dict[str, Any]) -> Job:
    job = Job(CHAT, {"messages": ASK, **body}, Priority.ONLINE, None)
    template = ChatTemplate(None, "", "<|im_end|>")
    preparer = Preparer(Letters(), template, ctx_per_slot=4096, n_slots=2, embedding_dim=8)
    preparer.prepare(job, itertools.count())
    return job


def test_preparing_a_chat_with_tools_sets_prompt_and_grammar() -> None:
    job = prepared({"tools": [WEATHER], "tool_choice": "required"})
    assert job.tools is not None and job.params.grammar is not None
    assert "get_weather" in job.prompt_texts[0]
    assert job.prompt_texts[0].startswith("<|im_start|>system\nYou can call these functions")
    plain = prepared({"tools": [WEATHER], "tool_choice": "none"})
    assert plain.params.grammar is None and "get_weather" not in plain.prompt_texts[0]
    with pytest.raises(EngineError) as caught:
        prepared({"tools": [WEATHER], "response_format": {"type": "json_object"}})
    assert caught.value.param == "response_format"
    with pytest.raises(EngineError) as caught:
        prepared({"tools": [WEATHER], "n": 2})
    assert caught.value.param == "n"


def finished(job: Job, text: str, reason: str = "stop") -> Job:
    job.prompts = [[1, 2, 3]]
    job.choices = [Choice(0, text=text, completion_tokens=5, finish_reason=reason)]
    return job


CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


def test_a_call_answer_is_tool_calls_with_finish_reason_tool_calls() -> None:
    job = finished(prepared({"tools": [WEATHER], "tool_choice": "required"}), CALL)
    body = ChatCompletion.model_validate(answers.completion(job, "m", "fp"))
    choice = body.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    text = finished(prepared({"tools": [WEATHER]}), "Sunny.")
    body = ChatCompletion.model_validate(answers.completion(text, "m", "fp"))
    assert (
        body.choices[0].message.content == "Sunny." and body.choices[0].message.tool_calls is None
    )
    cut = finished(prepared({"tools": [WEATHER]}), CALL[:20], "length")
    body = ChatCompletion.model_validate(answers.completion(cut, "m", "fp"))
    assert (
        body.choices[0].finish_reason == "length" and body.choices[0].message.content == CALL[:20]
    )


def stream(job: Job, pieces: list[str]) -> list[ChatCompletionChunk]:
    choice = job.choices[0]
    final_text, choice.text = choice.text, ""
    chunks = []
    for piece in pieces:
        choice.text += piece
        chunks += answers.choice_chunks(job, choice, piece, "m", "fp")
    assert choice.text == final_text
    chunks += answers.choice_chunks(job, choice, None, "m", "fp")
    return [ChatCompletionChunk.model_validate(c) for c in chunks]


def test_streamed_call_is_held_back_and_sent_whole_as_tool_calls() -> None:
    job = finished(prepared({"tools": [WEATHER], "tool_choice": "auto"}), CALL)
    chunks = stream(job, [CALL[:10], CALL[10:30], CALL[30:]])
    assert len(chunks) == 2
    delta = chunks[0].choices[0].delta
    assert delta.role == "assistant" and delta.content is None and delta.tool_calls
    assert delta.tool_calls[0].index == 0 and delta.tool_calls[0].id
    assert delta.tool_calls[0].function and delta.tool_calls[0].function.name == "get_weather"
    assert chunks[1].choices[0].finish_reason == "tool_calls"
    # The final body has the same call id as the stream.
    body = answers.completion(job, "m", "fp")
    assert body["choices"][0]["message"]["tool_calls"][0]["id"] == delta.tool_calls[0].id


def test_streamed_text_with_tools_streams_once_it_is_not_a_call() -> None:
    job = finished(prepared({"tools": [WEATHER], "tool_choice": "auto"}), " It is sunny.")
    chunks = stream(job, [" ", "It", " is", " sunny."])
    deltas = [c.choices[0].delta for c in chunks]
    assert deltas[0].role == "assistant" and deltas[0].content == " It"
    assert "".join(d.content or "" for d in deltas) == " It is sunny."
    assert chunks[-1].choices[0].finish_reason == "stop"
