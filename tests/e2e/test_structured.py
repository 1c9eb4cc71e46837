"""Structured answers through the openai SDK on the real model: every answer to many JSON
schemas (nested objects, arrays with minItems, enums, anyOf, number bounds, pattern,
recursion through $ref) parses and validates; bounded tool arguments stay in bounds; a
schema the grammar cannot hold is refused online and, with its line number, in a batch."""

from __future__ import annotations

import io
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
from openai import OpenAI

from tests.factories import CHAT, batch_line, jsonl
from tests.http_helpers import wait_for_status
from tests.live import LiveServer
from tests.schemas import SCHEMAS, strict

MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> OpenAI:
    return OpenAI(api_key="unused", base_url=live_server.api, max_retries=0)


def answer(client: OpenAI, question: str, schema: dict[str, Any]) -> Any:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        temperature=0,
        max_tokens=160,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
    )
    return reply.choices[0]


def test_every_answer_parses_and_holds_its_schema(client: OpenAI) -> None:
    with ThreadPoolExecutor(len(SCHEMAS)) as pool:
        choices = list(pool.map(lambda qs: answer(client, *qs), SCHEMAS))
    for (_, schema), choice in zip(SCHEMAS, choices, strict=True):
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content or ""), schema)


STARS = {
    "type": "function",
    "function": {
        "name": "rate",
        "description": "Rate a review from 1 to 5 stars.",
        "strict": True,
        "parameters": strict({"stars": {"type": "integer", "minimum": 1, "maximum": 5}}),
    },
}


def test_tool_arguments_keep_their_number_bounds(client: OpenAI) -> None:
    reviews = ["Ten out of ten!", "Best ever, 10/10", "7 stars!!", "Awful: zero stars."]

    def rate(review: str) -> Any:
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Rate this review: {review}"}],
            tools=[STARS],  # type: ignore[list-item]
            tool_choice="required",
            temperature=0,
            max_tokens=24,
        )
        (call,) = reply.choices[0].message.tool_calls or []
        return json.loads(call.function.arguments)

    with ThreadPoolExecutor(len(reviews)) as pool:
        for args in pool.map(rate, reviews):
            jsonschema.validate(args, STARS["function"]["parameters"])  # type: ignore[index]


UNIQUE = strict({"ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}})


def test_a_keyword_the_grammar_cannot_hold_is_a_400(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        answer(client, "Give ids.", UNIQUE)
    assert caught.value.body["code"] == "unsupported_schema"  # type: ignore[index]
    assert caught.value.body["param"] == "response_format"  # type: ignore[index]
    assert "uniqueItems" in caught.value.body["message"]  # type: ignore[index]


def test_in_a_batch_the_refused_schema_is_the_lines_error(client: OpenAI) -> None:
    good = batch_line("good", "hi", model=MODEL, max_tokens=4)
    bad = batch_line("bad", "Give ids.", model=MODEL, max_tokens=4)
    bad["body"]["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "ids", "schema": UNIQUE, "strict": True},
    }
    buf = io.BytesIO(jsonl(good, bad))
    buf.name = "schemas.jsonl"
    f = client.files.create(file=buf, purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    b = wait_for_status(client.batches.retrieve, b.id, {"failed"}, 60)
    assert b.errors is not None and b.errors.data is not None
    (error,) = b.errors.data
    assert (error.line, error.code, error.param) == (
        2,
        "unsupported_schema",
        "body.response_format",
    )


def test_logprobs_of_a_schema_answer_are_numbers(client: OpenAI) -> None:
    question, schema = SCHEMAS[2]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        temperature=0,
        max_tokens=48,
        logprobs=True,
        top_logprobs=5,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
    )
    choice = reply.choices[0]
    jsonschema.validate(json.loads(choice.message.content or ""), schema)
    assert choice.logprobs is not None and choice.logprobs.content
    # Each token of the answer (none fed ahead without logits), and where the grammar left one
    # choice, the others at OpenAI's -9999.
    assert "".join(t.token for t in choice.logprobs.content) == choice.message.content
    shown = [a.logprob for t in choice.logprobs.content for a in t.top_logprobs]
    assert all(-9999.0 <= x <= 0.0 for x in shown) and -9999.0 in shown
