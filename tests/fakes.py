"""A fake engine for unit and integration tests of the runner's and the API's bookkeeping.

It answers at once (or after `delay`) with OpenAI-shaped bodies built from the request,
so a test can check that every line lands exactly once. Never used on the e2e path.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

from app.engine.base import (
    CHAT,
    EMBEDDINGS,
    EngineError,
    EngineStats,
    ModelInfo,
    Priority,
    RequestCancelled,
)


def prompt(endpoint: str, body: dict[str, Any]) -> str:
    """The text a request asks about: its last message, or its prompt."""
    return str(body["messages"][-1]["content"] if endpoint == CHAT else body.get("prompt"))


class FakeEngine:
    #: A prompt holding this word never finishes until cancelled (see HangingEngine).
    hang_word: str | None = None

    def __init__(self, *, delay: float = 0.0, n_slots: int = 4) -> None:
        self.delay = delay
        self.info = ModelInfo(
            id="fake-model",
            path="/dev/null",
            size_bytes=0,
            quantization="F32",
            n_ctx_train=512,
            ctx_per_slot=512,
            n_slots=n_slots,
            backend="CPU",
            n_gpu_layers=0,
            embedding_dim=4,
            has_chat_template=True,
            created=0,
        )
        self.submitted: list[tuple[str, dict[str, Any], Priority]] = []
        self.cancelled = 0
        self.hanging: list[Future[dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._timers: list[threading.Timer] = []

    def submit(
        self,
        endpoint: str,
        body: dict[str, Any],
        *,
        priority: Priority = Priority.ONLINE,
        on_chunk: Any = None,
    ) -> Future[dict[str, Any]]:
        fut: Future[dict[str, Any]] = Future()
        with self._lock:
            self.submitted.append((endpoint, body, priority))
            if self.hang_word and self.hang_word in prompt(endpoint, body):
                self.hanging.append(fut)
                return fut

        def finish() -> None:
            if fut.done():
                return
            try:
                fut.set_result(self.answer(endpoint, body))
            except EngineError as exc:
                fut.set_exception(exc)

        if self.delay:
            t = threading.Timer(self.delay, finish)
            self._timers.append(t)
            t.start()
        else:
            finish()
        return fut

    def answer(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        if endpoint == EMBEDDINGS:
            inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
            return {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": [0.5, 0.5, 0.5, 0.5]}
                    for i in range(len(inputs))
                ],
                "model": self.info.id,
                "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)},
            }
        text = body["messages"][-1]["content"] if endpoint == CHAT else body["prompt"]
        if "FAIL" in text:
            raise EngineError(
                "The prompt is longer than the context.",
                code="context_length_exceeded",
                param="messages",
            )
        words = len(text.split())
        usage = {
            "prompt_tokens": words,
            "completion_tokens": words + 1,
            "total_tokens": 2 * words + 1,
        }
        if endpoint == CHAT:
            message = {"role": "assistant", "content": f"echo: {text}"}
            choice: dict[str, Any] = {"index": 0, "message": message}
            kind = {"id": "chatcmpl-fake", "object": "chat.completion"}
        else:
            choice = {"index": 0, "text": f"echo: {text}"}
            kind = {"id": "cmpl-fake", "object": "text_completion"}
        return {
            **kind,
            "created": int(time.time()),
            "model": self.info.id,
            "choices": [{**choice, "logprobs": None, "finish_reason": "stop"}],
            "usage": usage,
        }

    def cancel(self, future: Future[dict[str, Any]]) -> None:
        if not future.done():
            self.cancelled += 1
            future.set_exception(RequestCancelled())

    def stats(self) -> EngineStats:
        return EngineStats()

    def close(self) -> None:
        for t in self._timers:
            t.cancel()


class HangingEngine(FakeEngine):
    """The fake engine, except that a prompt holding HANG never finishes until cancelled."""

    hang_word = "HANG"
