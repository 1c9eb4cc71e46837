"""An upstream's HTTP answers read as the Engine contract's: errors, Retry-After, streams.

Pure functions of what the upstream sent; no engine state. `UpstreamEngine` uses them.
"""

from __future__ import annotations

import json
import time
from email.utils import parsedate_to_datetime
from typing import Any

from app.engine.base import EngineError
from app.wire.endpoints import CHAT, RESPONSES

#: A longer Retry-After than this is cut to it, so a confused upstream cannot park lines for days.
RETRY_AFTER_MAX_S = 120.0


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds from a Retry-After header (a number of seconds or an HTTP date), capped."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(RETRY_AFTER_MAX_S, max(0.0, seconds))


def error_from(status: int, answer: Any, engine: str) -> EngineError:
    """The upstream's error as the request's error: its status, and its message, type, param
    and code when it sent OpenAI's shape (vLLM's older flat shape is read too)."""
    detail: dict[str, Any] = {}
    if isinstance(answer, dict):
        inner = answer.get("error")
        detail = inner if isinstance(inner, dict) else answer
    message = detail.get("message") if detail else None
    if not isinstance(message, str) or not message:
        text = answer if isinstance(answer, str) and answer else json.dumps(answer)[:1000]
        message = f"The upstream engine '{engine}' answered HTTP {status}: {text}"
    code, param, kind = detail.get("code"), detail.get("param"), detail.get("type")
    return EngineError(
        message,
        status_code=status,
        code=code if isinstance(code, str) else None,
        param=param if isinstance(param, str) else None,
        type=kind if isinstance(kind, str) and kind not in ("", "error") else default_type(status),
    )


def default_type(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


class StreamAssembler:
    """Builds the whole response body from a stream's chunks (the future's result)."""

    def __init__(self) -> None:
        self.first: dict[str, Any] = {}
        self.usage: dict[str, Any] | None = None
        self.choices: dict[int, dict[str, Any]] = {}
        self.response: dict[str, Any] | None = None

    def add(self, chunk: Any) -> None:
        if not isinstance(chunk, dict):
            return
        if isinstance(chunk.get("response"), dict):  # a Responses event: keep the latest object
            self.response = chunk["response"]
            return
        if not self.first:
            self.first = chunk
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            index = int(choice.get("index") or 0)
            acc = self.choices.setdefault(
                index, {"index": index, "text": "", "role": "assistant", "finish_reason": None}
            )
            delta = choice.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(piece, str):
                acc["text"] += piece
            if choice.get("finish_reason"):
                acc["finish_reason"] = choice["finish_reason"]

    def body(self, endpoint: str) -> dict[str, Any]:
        if endpoint == RESPONSES:  # `response.completed` carries the whole Response
            return self.response or {}
        chat = endpoint == CHAT
        choices = []
        for index in sorted(self.choices):
            acc = self.choices[index]
            if chat:
                message = {"role": acc["role"], "content": acc["text"]}
                choice = {"index": index, "message": message, "logprobs": None}
            else:
                choice = {"index": index, "text": acc["text"], "logprobs": None}
            choices.append({**choice, "finish_reason": acc["finish_reason"]})
        return {
            "id": self.first.get("id", ""),
            "object": "chat.completion" if chat else "text_completion",
            "created": self.first.get("created", int(time.time())),
            "model": self.first.get("model", ""),
            "choices": choices,
            "usage": self.usage,
        }


__all__ = [
    "RETRY_AFTER_MAX_S",
    "StreamAssembler",
    "default_type",
    "error_from",
    "retry_after_seconds",
]
