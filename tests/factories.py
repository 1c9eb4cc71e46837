"""Builders of batch input, as an OpenAI script writes it: a chat body, a batch line, JSONL;
and the one reader of the JSONL files a batch writes back."""

from __future__ import annotations

import json
from typing import Any

CHAT = "/v1/chat/completions"


#: A message's content: its text, or its parts (text and images).
Content = str | list[dict[str, Any]]


def chat_body(text: Content, *, model: str = "m", **body: Any) -> dict[str, Any]:
    """A /v1/chat/completions body with one user message; `body` adds or replaces fields."""
    return {"model": model, "messages": [{"role": "user", "content": text}], **body}


def batch_line(
    cid: str, text: Content, *, url: str = CHAT, model: str = "m", **body: Any
) -> dict[str, Any]:
    """One line of a batch input file: a POST of a chat body to `url` (a chat URL by default;
    another URL keeps the chat body, which is how tests send a line to the wrong endpoint)."""
    return {
        "custom_id": cid,
        "method": "POST",
        "url": url,
        "body": chat_body(text, model=model, **body),
    }


def jsonl(*lines: dict[str, Any] | str) -> bytes:
    """A JSONL file: each dict as one JSON line, each str as it is (a broken or blank line)."""
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def jsonl_texts(data: str | bytes) -> list[str]:
    """A JSONL file's lines as text, blank ones left out. A line ends at a newline only:
    str.splitlines() also breaks at U+2028, U+0085 and the like, which a model's answer
    may hold raw inside a JSON string."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    return [line for line in text.split("\n") if line.strip()]


def jsonl_lines(data: str | bytes) -> list[dict[str, Any]]:
    """A JSONL file's lines, each parsed (an output or error file, an input file, a body)."""
    return [json.loads(line) for line in jsonl_texts(data)]
