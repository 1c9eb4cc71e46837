"""A thinking model's thought, read from a finished answer body, apart from its answer.

Engines put the thought beside the answer: chat's `message.reasoning_content` (or
`reasoning`, as `--reasoning-field` may name it, vLLM's and Ollama's spelling), and
Responses' `reasoning` output items (`content` of `reasoning_text` parts, else their
`summary`). The dashboard's explorer and a sheet's `reasoning` column read it here; the
answer itself (`content`, the `message` items) is never the thought.
"""

from __future__ import annotations

from typing import Any


def message_thought(message: Any) -> str:
    """A chat message's thought ("" for none)."""
    if not isinstance(message, dict):
        return ""
    thought = message.get("reasoning_content") or message.get("reasoning")
    return thought if isinstance(thought, str) else ""


def _parts_text(parts: Any) -> str:
    if not isinstance(parts, list):
        return ""
    return "\n".join(str(p.get("text") or "") for p in parts if isinstance(p, dict))


def answer_thought(body: Any) -> str:
    """The thought of an answer body: a chat completion's first choice's, or a Response's
    reasoning items' ("" for none, or for an error body)."""
    if not isinstance(body, dict):
        return ""
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return message_thought(choices[0].get("message"))
    items = body.get("output") if body.get("object") == "response" else None
    if not isinstance(items, list):
        return ""
    texts = [
        _parts_text(item.get("content")) or _parts_text(item.get("summary"))
        for item in items
        if isinstance(item, dict) and item.get("type") == "reasoning"
    ]
    return "\n\n".join(t for t in texts if t)
