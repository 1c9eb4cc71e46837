"""A thinking model's thought read from an answer body (chat's `reasoning_content` or
`reasoning`, Responses' reasoning items) and its tokens in a line's usage, as the batch
sums them (`usage_counts`): canned bodies in the engines' canonical shape."""

from __future__ import annotations

from typing import Any

from app.batches.lifecycle.lifecycle import usage_counts
from app.wire.thoughts import answer_thought


def chat(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }


RESPONSE = {
    "object": "response",
    "output": [
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Two and two."}],
            "status": "completed",
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "4"}],
        },
    ],
    "usage": {
        "input_tokens": 9,
        "input_tokens_details": {"cached_tokens": 2},
        "output_tokens": 12,
        "output_tokens_details": {"reasoning_tokens": 10},
        "total_tokens": 21,
    },
}


def test_the_thought_is_read_apart_from_the_answer() -> None:
    assert answer_thought(chat({"content": "4", "reasoning_content": "Two and two."})) == (
        "Two and two."
    )
    assert answer_thought(chat({"content": "4", "reasoning": "Two and two."})) == "Two and two."
    assert answer_thought(chat({"content": "<think>inline</think>4"})) == ""
    assert answer_thought(RESPONSE) == "Two and two."
    summary = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Added."}]}
    assert answer_thought({"object": "response", "output": [summary]}) == "Added."
    assert answer_thought({"error": {"message": "no"}}) == answer_thought(None) == ""


def test_reasoning_tokens_in_chat_and_responses_usage() -> None:
    chat_usage = {
        "prompt_tokens": 9,
        "completion_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 2},
        "completion_tokens_details": {"reasoning_tokens": 10},
    }
    assert usage_counts(chat_usage) == (9, 12, 2, 10)
    assert usage_counts(RESPONSE["usage"]) == (9, 12, 2, 10)  # type: ignore[arg-type]
    assert usage_counts({"prompt_tokens": 3, "completion_tokens": 4}) == (3, 4, 0, 0)
