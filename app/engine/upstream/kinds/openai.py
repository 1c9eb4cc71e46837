"""The wire of an OpenAI-compatible server: the `openai` kind, and the kinds named for the
servers that speak it (`vllm`, `sglang`, `llama-server`, `ollama`, `batchyard`).

Its requests are the OpenAI body as sent, POSTed to the endpoint's own path (`/v1/...`)
with the key as `Authorization: Bearer`; `GET /v1/models` lists its models. The kinds differ
only in how a body's reasoning controls are written for their server (thoughts.py: WIRES);
`openai` sends them as written. This module reads what it answers as the Engine contract's:
errors (OpenAI's shape, or vLLM's older flat one), Retry-After, server-sent event streams,
and each answer's thought as batchyard's `reasoning_content` (thoughts.py). Pure functions
of what the upstream sent; no engine state.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from typing import Any

from app.config.upstreams import UpstreamSpec
from app.engine.base import EngineError
from app.engine.upstream.kinds.thoughts import WIRES, StreamThoughts, incoming, outgoing
from app.runtime import jsoncodec
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
            thought = delta.get("reasoning_content") if isinstance(delta, dict) else None
            if isinstance(thought, str):
                acc["thought"] = acc.get("thought", "") + thought
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
                if "thought" in acc:
                    message["reasoning_content"] = acc["thought"]
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


class EventReader:
    """One server-sent event stream: `data: {chunk}` lines until `data: [DONE]`; an event
    carrying an error is the request's error (the API relays it as its own). A chat chunk's
    thought is batchyard's `delta.reasoning_content` (StreamThoughts)."""

    def __init__(self, endpoint: str, engine: str) -> None:
        self.endpoint = endpoint
        self.engine = engine
        self.done = False
        self._chunks = StreamAssembler()
        self._thoughts = StreamThoughts() if endpoint == CHAT else None

    def read(self, line: bytes) -> list[dict[str, Any]]:
        text = line.decode("utf-8").strip()
        if not text.startswith("data:"):
            return []
        data = text[len("data:") :].strip()
        if data == "[DONE]":
            self.done = True
            return []
        chunk = jsoncodec.loads(data)
        if isinstance(chunk, dict) and (
            isinstance(chunk.get("error"), dict) or chunk.get("type") == "error"
        ):  # the upstream failed mid-stream
            raise error_from(500, chunk, self.engine)
        if not isinstance(chunk, dict):
            return [chunk]
        if self._thoughts is not None:
            self._thoughts.chunk(chunk)
        elif isinstance(chunk.get("response"), dict):  # a Responses event with the Response
            incoming(RESPONSES, chunk["response"])
        self._chunks.add(chunk)
        return [chunk]

    def body(self) -> dict[str, Any]:
        return self._chunks.body(self.endpoint)


class OpenAIKind:
    """An OpenAI-compatible server's kind (see the module's docstring); `name` is its row
    of thoughts.py's WIRES."""

    models_path = "/v1/models"

    def __init__(self, name: str = "openai") -> None:
        self.name = name
        self.wire = WIRES[name]

    def headers(self, spec: UpstreamSpec) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if spec.key:
            headers["Authorization"] = f"Bearer {spec.key}"
        return headers

    def path(self, endpoint: str) -> str:
        return endpoint  # batchyard's endpoints are OpenAI's paths

    def encode(self, endpoint: str, body: dict[str, Any]) -> bytes:
        return jsoncodec.dumps_bytes(outgoing(self.wire, endpoint, body))

    def answer(self, endpoint: str, content: bytes) -> dict[str, Any]:
        data = jsoncodec.loads(content)
        if not isinstance(data, dict):
            raise ValueError("the answer is not a JSON object")
        return incoming(endpoint, data)

    def error(self, status: int, content: bytes, engine: str) -> EngineError:
        try:
            parsed = jsoncodec.loads(content)
        except ValueError:
            parsed = content.decode("utf-8", "replace")[:1000]
        return error_from(status, parsed, engine)

    def retry_after(self, headers: Mapping[str, str]) -> float | None:
        return retry_after_seconds(headers.get("retry-after"))

    def stream(self, endpoint: str, engine: str) -> EventReader:
        return EventReader(endpoint, engine)

    def models(self, content: bytes) -> list[dict[str, Any]]:
        answer = jsoncodec.loads(content)
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list):
            raise ValueError("GET /v1/models answered without a `data` list")
        return [m for m in data if isinstance(m, dict)]


#: This module's kinds, as app/engine/upstream/kinds/__init__.py: kind_of loads the one
#: KINDS names (`KIND` is `openai`'s).
KIND = OpenAIKind("openai")
VLLM = OpenAIKind("vllm")
SGLANG = OpenAIKind("sglang")
LLAMA_SERVER = OpenAIKind("llama-server")
OLLAMA = OpenAIKind("ollama")
BATCHYARD = OpenAIKind("batchyard")

__all__ = [
    "BATCHYARD",
    "KIND",
    "LLAMA_SERVER",
    "OLLAMA",
    "RETRY_AFTER_MAX_S",
    "SGLANG",
    "VLLM",
    "EventReader",
    "OpenAIKind",
    "StreamAssembler",
    "default_type",
    "error_from",
    "retry_after_seconds",
]
