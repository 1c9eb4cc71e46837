"""`present` (app/engine/reasoning.py): a chat answer's thought, which every engine writes as
`reasoning_content`, leaves under the name --reasoning-field gives; other bodies as they are."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.engine.reasoning import FIELDS, present

ANSWER = {
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"content": "4", "reasoning_content": "2+2"}}],
}
CHUNK = {
    "object": "chat.completion.chunk",
    "choices": [{"index": 0, "delta": {"reasoning_content": "2+"}}],
}


def part(body: dict[str, Any]) -> dict[str, Any]:
    choice = body["choices"][0]
    return dict(choice.get("message") or choice["delta"])


@pytest.mark.parametrize("body", [ANSWER, CHUNK])
def test_each_field_names_the_thought_its_way(body: dict[str, Any]) -> None:
    thought = part(body)["reasoning_content"]
    rest = {k: v for k, v in part(body).items() if k != "reasoning_content"}
    assert part(present(copy.deepcopy(body), "reasoning_content")) == part(body)
    assert part(present(copy.deepcopy(body), "reasoning")) == {**rest, "reasoning": thought}
    assert part(present(copy.deepcopy(body), "both")) == {
        **rest,
        "reasoning_content": thought,
        "reasoning": thought,
    }


@pytest.mark.parametrize(
    "body",
    [
        {"object": "response", "output": [{"type": "reasoning", "content": []}]},
        {"object": "text_completion", "choices": [{"index": 0, "text": "4"}]},
        {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "4"}}]},
        {"error": {"message": "no"}},
    ],
)
def test_any_other_body_leaves_as_it_is(body: dict[str, Any]) -> None:
    for field in FIELDS:
        assert present(copy.deepcopy(body), field) == body
