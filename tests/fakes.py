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


class FakeEngine:
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
        words = text.split()
        if endpoint == CHAT:
            return {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.info.id,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"echo: {text}"},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": len(words),
                    "completion_tokens": len(words) + 1,
                    "total_tokens": 2 * len(words) + 1,
                },
            }
        return {
            "id": "cmpl-fake",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.info.id,
            "choices": [
                {"index": 0, "text": f"echo: {text}", "logprobs": None, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": len(words),
                "completion_tokens": len(words) + 1,
                "total_tokens": 2 * len(words) + 1,
            },
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
