"""A fake engine for unit and integration tests of the runner's and the API's bookkeeping.

It answers at once (or after `delay`) with OpenAI-shaped bodies built from the request,
so a test can check that every line lands exactly once. Never used on the e2e path.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from typing import Any

from app.config.upstreams import UpstreamSpec
from app.engine.base import EngineError, EngineStats, ModelInfo, Priority, RequestCancelled
from app.wire.endpoints import CHAT, EMBEDDINGS


def text_of(content: Any) -> str:
    """A message's content as text: a string as it is; content parts' text joined, each
    image part as `[image]` (so that an echo shows where an image went)."""
    if not isinstance(content, list):
        return str(content)
    return " ".join(
        "[image]" if p.get("type") in ("image_url", "input_image") else str(p.get("text", ""))
        for p in content
        if isinstance(p, dict)
    )


def prompt(endpoint: str, body: dict[str, Any]) -> str:
    """The text a request asks about: its last message, or its prompt."""
    return text_of(body["messages"][-1]["content"]) if endpoint == CHAT else str(body.get("prompt"))


class FakeEngine:
    #: No model is loaded: what a load took is not known (the Engine contract).
    measured_bytes: int | None = None
    load_seconds: float | None = None
    freed_bytes: int | None = None
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
        self.hanging_bodies: list[dict[str, Any]] = []  # the body of each hanging request
        self._lock = threading.Lock()
        self._timers: list[threading.Timer] = []

    def submit(
        self,
        endpoint: str,
        body: dict[str, Any],
        *,
        priority: Priority = Priority.ONLINE,
        on_chunk: Any = None,
        model: str | None = None,
    ) -> Future[dict[str, Any]]:
        """`model`: the id the answer carries (a pool's routed id), else `info.id`."""
        fut: Future[dict[str, Any]] = Future()
        with self._lock:
            self.submitted.append((endpoint, body, priority))
            if self.hang_word and self.hang_word in prompt(endpoint, body):
                self.hanging.append(fut)
                self.hanging_bodies.append(body)
                return fut

        def finish() -> None:
            if fut.done():
                return
            try:
                answer = self.answer(endpoint, body)
                fut.set_result({**answer, "model": model} if model else answer)
            except EngineError as exc:
                fut.set_exception(exc)

        if self.delay:
            t = threading.Timer(self.delay, finish)
            t.daemon = True  # a test that ends before its lines does not wait for them
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
        text = prompt(endpoint, body) if endpoint == CHAT else body["prompt"]
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

    def prompt_tokens(self, endpoint: str, body: dict[str, Any]) -> int | None:
        return None

    def image_form(self, model: Any) -> tuple[str, int]:
        """PNG and JPEG data URLs, any size: as the embedded engine's."""
        return ("png", 0)

    def stats(self) -> EngineStats:
        return EngineStats()

    def close(self) -> None:
        for t in self._timers:
            t.cancel()


class HangingEngine(FakeEngine):
    """The fake engine, except that a prompt holding HANG never finishes until cancelled."""

    hang_word = "HANG"


class ThinkingEngine(FakeEngine):
    """The fake engine as a thinking model answers, in batchyard's canonical shape: each chat
    answer's thought in `message.reasoning_content`, apart from its `content`, and counted
    in `usage.completion_tokens_details.reasoning_tokens` (within completion_tokens). Asked
    for a json_schema object, the content is that object with every field "answer", and
    the thought spells the same object with every field "thought": a cell filled from the
    thought shows it."""

    THOUGHT_TOKENS = 5

    def answer(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        out = super().answer(endpoint, body)
        if endpoint != CHAT:
            return out
        schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")
        fields = list((schema or {}).get("properties") or {})
        message = out["choices"][0]["message"]
        if fields:
            message["content"] = json.dumps(dict.fromkeys(fields, "answer"))
        message["reasoning_content"] = "Let me see. " + json.dumps(dict.fromkeys(fields, "thought"))
        usage = out["usage"]
        usage["completion_tokens"] += self.THOUGHT_TOKENS
        usage["total_tokens"] += self.THOUGHT_TOKENS
        usage["completion_tokens_details"] = {"reasoning_tokens": self.THOUGHT_TOKENS}
        return out


class FakeLoads:
    """A model pool's loader (app/engine/pool/loading.py `Loader`) of fake engines: a
    HangingEngine (2 slots) for each entry, answering as that model."""

    def __init__(self) -> None:
        self.engines: list[HangingEngine] = []

    def __call__(self, settings: Any, e: Any) -> HangingEngine:
        engine = HangingEngine(n_slots=2)
        engine.info.id = e.id
        self.engines.append(engine)
        return engine

    def ids(self) -> list[str]:
        return [e.info.id for e in self.engines]


class FakeUpstream(HangingEngine):
    """The fake engine standing in for an upstream in a registry: it serves the model names
    in `served` (as if its /v1/models listed them; a test may change the list) and, like
    HangingEngine, never finishes a HANG prompt until the test says so (`finish`)."""

    kind = "openai"
    up = True  # a test may set it False: the upstream is down
    lane_depth = 2  # the room arithmetic these tests spell out (the real upstreams take 4)

    def __init__(self, name: str, served: list[str], *, n_slots: int = 2) -> None:
        super().__init__(n_slots=n_slots)
        self.name = name
        self.spec = UpstreamSpec(name=name, url=f"http://{name}.invalid/v1")
        self.served = list(served)
        self.info.id = served[0]

    def models(self) -> list[str]:
        return list(self.served)

    def model_cards(self) -> list[dict[str, Any]]:
        return [{"id": m, "created": 0, "owned_by": self.name} for m in self.served]


def finish(engine: FakeEngine, n: int | None = None) -> int:
    """Answer the first `n` (default: all) of the engine's hanging requests; how many."""
    with engine._lock:
        hung = list(zip(engine.hanging, engine.hanging_bodies, strict=True))
    waiting = [(fut, body) for fut, body in hung if not fut.done()][:n]
    for fut, body in waiting:
        fut.set_result(engine.answer(CHAT, body))
    return len(waiting)
