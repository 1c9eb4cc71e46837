"""Thinking models end to end: a live `batchyard serve` whose --models-dir holds the test
thinking models (harness/reasoning_model.py: the embedded SmolLM2 with Qwen3's `<think>`
and with DeepSeek-R1's thought opened by its template), the official openai SDK as the
client, greedy decoding. (gpt-oss's channels are split in tests/unit/engine/test_reasoning.py.)

The thought comes back apart from the answer (chat, its stream, Responses and its stream),
counted in reasoning_tokens within the completion's; llama-server (`--reasoning-format
deepseek`, the build bench/build_llama_server.sh makes) split the same file's answer to the
same question alike: the thought and the answer's first words below are its. Effort none
turns Qwen3's thinking off; a budget closes a thought; a thought cut by the token limit is
never the answer; a json_schema holds the answer after a free thought; a batch sums its
lines' reasoning tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from harness.reasoning_model import written
from tests.factories import jsonl, jsonl_lines
from tests.http_helpers import wait_for_status
from tests.live import OUTPUT, LiveServer, start_server, stop_server
from tests.models import CACHE

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is 2+2?"}]
#: llama-server's split of the `think` model's answer to QUESTION (greedy): its thought, and
#: the words its answer opens with (later words part where the two servers' arithmetic does).
JUDGED_THOUGHT = "The answer to this classic math problem is 4."
JUDGED_OPENING = "In mathematics, 2 + 2 is an"
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
    models = tmp_path_factory.mktemp("thinking-models")
    for fmt in ("think", "opened"):
        (models / f"{fmt}.gguf").symlink_to(written(CACHE / "reasoning-model", fmt))
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
    settings: dict[str, Any] = {"temperature": 0, "max_completion_tokens": 48, **extra}
    return sdk.chat.completions.create(model=model, messages=QUESTION, **settings)


def test_the_thought_comes_apart_counted_as_llama_server_splits_it(sdk: openai.OpenAI) -> None:
    answer = chat(sdk, "think")
    message = answer.choices[0].message
    assert message.reasoning_content == JUDGED_THOUGHT  # type: ignore[attr-defined]
    assert message.content is not None and message.content.startswith(JUDGED_OPENING)
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
    assert getattr(off, "reasoning_content", None) is None and off.content
    budget = chat(sdk, "think", extra_body={"thinking_token_budget": 4})
    message = budget.choices[0].message
    # llama-server's reasoning_budget_tokens 4 closes it after the same words.
    assert message.reasoning_content == "The answer to"  # type: ignore[attr-defined]
    assert message.content
    # The template that opens the thought: the output starts inside it.
    opened = chat(sdk, "opened").choices[0].message
    assert opened.reasoning_content == JUDGED_THOUGHT  # type: ignore[attr-defined]


def test_a_thought_cut_by_the_limit_is_never_the_answer(sdk: openai.OpenAI) -> None:
    cut = chat(sdk, "think", max_completion_tokens=5).choices[0]
    assert cut.finish_reason == "length" and cut.message.content == ""
    assert cut.message.reasoning_content  # type: ignore[attr-defined]
    response = sdk.responses.create(
        model="opened", input="What is 2+2?", max_output_tokens=5, temperature=0
    )
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in response.output] == ["reasoning"]


def test_a_schema_holds_the_answer_after_a_free_thought(sdk: openai.OpenAI) -> None:
    for model in ("think", "opened"):
        answer = chat(
            sdk, model, response_format={"type": "json_schema", "json_schema": SCHEMA}
        ).choices[0]
        assert isinstance(json.loads(answer.message.content or "")["answer"], int), model
        assert answer.message.reasoning_content, model  # type: ignore[attr-defined]


def test_responses_put_a_reasoning_item_before_the_message(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(
        model="think",
        input="What is 2+2?",
        reasoning={"effort": "low", "summary": "auto"},
        max_output_tokens=96,
        temperature=0,
    )
    assert [item.type for item in response.output] == ["reasoning", "message"]
    item = response.output[0]
    assert item.type == "reasoning" and item.id.startswith("rs_") and item.summary == []
    assert item.content and item.content[0].type == "reasoning_text"
    assert "<|" not in response.output_text and response.output_text
    assert response.reasoning is not None and response.reasoning.effort == "low"
    assert response.usage is not None
    assert 0 < response.usage.output_tokens_details.reasoning_tokens < response.usage.output_tokens

    with sdk.responses.stream(
        model="think", input="What is 2+2?", max_output_tokens=96, temperature=0
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    assert final.output[0].type == "reasoning"
    assert final.output[0].content == item.content and final.output_text == response.output_text


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
