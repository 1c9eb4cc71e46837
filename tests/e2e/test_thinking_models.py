"""Thinking models end to end: a live `batchyard serve` whose --models-dir holds the test
thinking models (tests/reasoning.py: the embedded SmolLM2 with Qwen3's `<think>`, with
DeepSeek-R1's thought opened by its template, and with gpt-oss's channels), the official
openai SDK as the client, greedy decoding.

The thought comes back apart from the answer (chat, its stream, Responses and its stream),
counted in reasoning_tokens within the completion's. llama-server (`--reasoning-format
deepseek -fa on -ctk q8_0 -ctv q8_0`, the build bench/build_llama_server.sh makes; its
answers are in bench/README.md, bench/reasoning_model.py asks it again) split the same
files' answers to the same question alike: every thought and answer below is its. Effort
none turns Qwen3's thinking off; a budget closes a thought after as many tokens as
llama-server's; a thought cut by the token limit is never the answer; a json_schema holds
the answer after a free thought; a batch sums its lines' reasoning tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.factories import jsonl, jsonl_lines
from tests.http_helpers import wait_for_status
from tests.live import OUTPUT, LiveServer, start_server, stop_server
from tests.reasoning import reasoning_models_dir

pytestmark = pytest.mark.slow

ASKED = "What is the capital of France?"
QUESTION = [{"role": "user", "content": ASKED}]
#: llama-server's split of the `think` and `opened` models' answers to QUESTION (greedy).
JUDGED_THOUGHT = "The capital of France is Paris."
JUDGED_ANSWER = (
    "Paris is a city steeped in history and culture, known for its iconic landmarks like the "
    "Eiffel Tower, Louvre Museum, Notre Dame Cathedral, and many others."
)
SCHEMA = {
    "name": "sum",
    "strict": True,
    "schema": {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    models = reasoning_models_dir()
    args = ["--parallel", "4", "--ctx-size", "1024", "--threads", "2", "--no-discover"]
    live = start_server(
        tmp_path_factory.mktemp("data"),
        OUTPUT / "reasoning.log",
        args=[*args, "--models-dir", str(models)],
        timeout=180,
    )
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def sdk(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


def chat(sdk: openai.OpenAI, model: str, **extra: Any) -> Any:
    settings: dict[str, Any] = {"temperature": 0, "max_completion_tokens": 64, **extra}
    return sdk.chat.completions.create(model=model, messages=QUESTION, **settings)


def test_the_thought_comes_apart_counted_as_llama_server_splits_it(sdk: openai.OpenAI) -> None:
    answer = chat(sdk, "think")
    message = answer.choices[0].message
    assert message.reasoning_content == JUDGED_THOUGHT  # type: ignore[attr-defined]
    assert message.content == JUDGED_ANSWER
    assert "<think>" not in message.content and "</think>" not in message.content
    usage = answer.usage
    assert usage is not None and usage.completion_tokens_details is not None
    thought = usage.completion_tokens_details.reasoning_tokens
    assert thought is not None and 0 < thought < usage.completion_tokens

    # Streamed: the same thought and answer, in reasoning_content deltas before content ones.
    stream = chat(sdk, "think", stream=True, stream_options={"include_usage": True})
    parts: dict[str, str] = {"reasoning_content": "", "content": ""}
    order = []
    for chunk in stream:
        if chunk.usage is not None:
            assert chunk.usage.completion_tokens_details is not None
            assert chunk.usage.completion_tokens_details.reasoning_tokens == thought
        for choice in chunk.choices:
            delta = choice.delta.model_dump()
            for key in parts:
                if delta.get(key):
                    parts[key] += delta[key]
                    order.append(key)
    assert parts == {"reasoning_content": JUDGED_THOUGHT, "content": message.content}
    assert order.index("content") > len(order) - order[::-1].index("reasoning_content") - 1


def test_effort_none_turns_thinking_off_and_a_budget_closes_the_thought(
    sdk: openai.OpenAI,
) -> None:
    off = chat(sdk, "think", reasoning_effort="none").choices[0].message
    assert getattr(off, "reasoning_content", None) is None
    assert off.content == "\nThe capital of France is Paris."
    # reasoning_format none keeps the thought inline, tags and all, as llama-server does.
    inline = chat(sdk, "think", extra_body={"reasoning_format": "none"}).choices[0].message
    assert inline.content == f"<think>\n{JUDGED_THOUGHT}</think>\n\n{JUDGED_ANSWER}"
    assert getattr(inline, "reasoning_content", None) is None
    # The template that opens the thought: the output starts inside it.
    opened = chat(sdk, "opened").choices[0].message
    assert (opened.reasoning_content, opened.content) == (JUDGED_THOUGHT, JUDGED_ANSWER)  # type: ignore[attr-defined]
    # llama-server's thinking_budget_tokens 4 closes each after the same words.
    for model in ("think", "opened"):
        budget = chat(sdk, model, extra_body={"thinking_token_budget": 4}).choices[0].message
        assert budget.reasoning_content == "The capital of", model  # type: ignore[attr-defined]
        assert budget.content == "The capital of France is Paris.", model
    channels = chat(sdk, "channels", extra_body={"thinking_token_budget": 4}).choices[0].message
    assert (channels.reasoning_content, channels.content) == (
        "The answer is:",
        "The answer is: France",
    )  # type: ignore[attr-defined]


def test_a_thought_cut_by_the_limit_is_never_the_answer(sdk: openai.OpenAI) -> None:
    cut = chat(sdk, "think", max_completion_tokens=5).choices[0]
    assert cut.finish_reason == "length" and cut.message.content == ""
    assert cut.message.reasoning_content  # type: ignore[attr-defined]
    response = sdk.responses.create(model="opened", input=ASKED, max_output_tokens=5, temperature=0)
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in response.output] == ["reasoning"]


def test_a_schema_holds_the_answer_after_a_free_thought(sdk: openai.OpenAI) -> None:
    for model in ("think", "opened", "channels"):
        answer = chat(
            sdk, model, response_format={"type": "json_schema", "json_schema": SCHEMA}
        ).choices[0]
        assert isinstance(json.loads(answer.message.content or "")["answer"], int), model
        assert answer.message.reasoning_content, model  # type: ignore[attr-defined]


def test_responses_put_a_reasoning_item_before_the_message(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(
        model="channels",
        input=ASKED,
        reasoning={"effort": "low", "summary": "auto"},
        max_output_tokens=64,
        temperature=0,
    )
    assert [item.type for item in response.output] == ["reasoning", "message"]
    item = response.output[0]
    assert item.type == "reasoning" and item.id.startswith("rs_") and item.summary == []
    assert item.content and item.content[0].type == "reasoning_text"
    # gpt-oss's template reads the effort: llama-server's answer with reasoning_effort low.
    assert (item.content[0].text, response.output_text) == ("The answer is: France",) * 2
    assert response.reasoning is not None and response.reasoning.effort == "low"
    assert response.usage is not None
    assert 0 < response.usage.output_tokens_details.reasoning_tokens < response.usage.output_tokens

    with sdk.responses.stream(
        model="channels", input=ASKED, max_output_tokens=64, temperature=0
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    assert final.output[0].type == "reasoning"
    assert final.output[0].content[0].text == "The answer is: Paris"  # type: ignore[union-attr]
    assert final.output_text == "The answer is: Paris"


def test_a_batch_sums_its_lines_reasoning_tokens(sdk: openai.OpenAI) -> None:
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "think",
                "messages": QUESTION,
                "temperature": 0,
                "max_completion_tokens": 24,
                "reasoning_effort": effort,
            },
        }
        for i, effort in enumerate(["high", "none"])
    ]
    f = sdk.files.create(file=("in.jsonl", jsonl(*lines)), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait_for_status(sdk.batches.retrieve, batch.id, timeout=180, poll=0.5)
    assert done.status == "completed" and done.output_file_id
    out = {
        x["custom_id"]: x["response"]["body"]
        for x in jsonl_lines(sdk.files.content(done.output_file_id).text)
    }
    thought = out["q0"]["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert out["q0"]["choices"][0]["message"]["reasoning_content"] == JUDGED_THOUGHT
    assert out["q1"]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    assert done.usage is not None
    assert done.usage.output_tokens_details.reasoning_tokens == thought > 0
