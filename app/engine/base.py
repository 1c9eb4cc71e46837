"""The engine contract: what the API and the batch runner ask of an inference engine.

The API and the runner never touch llama_cpp; they hand an OpenAI request body to an
`Engine` and get back the exact OpenAI response body the synchronous endpoint returns.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.errors import APIError


class Priority(enum.IntEnum):
    """Lower runs first: online requests take a free slot before any batch line."""

    ONLINE = 0
    BATCH = 1


class EngineError(APIError):
    """A request-level failure, shaped like an OpenAI error.

    Raised (through the future) for a request the engine refuses or cannot finish:
    a prompt longer than a slot's context, parameters out of range, a cancelled request.
    It never means the engine itself is broken; the next request runs as usual.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 400,
        code: str | None = None,
        param: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(status_code, message, param=param, code=code, type=type)


class RequestCancelled(EngineError):
    """The request was withdrawn (batch cancelled or expired) before it finished."""

    def __init__(self, message: str = "The request was cancelled.") -> None:
        super().__init__(message, status_code=499, code="request_cancelled")


class EngineUnavailable(EngineError):
    """The engine itself cannot be reached (its server is down), not a fault of the request.

    An upstream raises it when its server refused the connection, did not answer the
    connect, had no DNS name, or answered 502/503/504 through every retry. The runner puts
    the line back in the queue without using an attempt and stops claiming for the engine's
    lane until the engine says it is up again (`Lane.up`); an online request gets it as 503.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, status_code=503, code="engine_unavailable", type="server_error")


def engine_closed() -> EngineError:
    """The error of a request sent to (or still queued in) an engine that is shutting down."""
    return EngineError(
        "The engine is shut down.", status_code=503, code="engine_closed", type="server_error"
    )


@dataclass
class ModelInfo:
    """What the server says about the loaded model (`/v1/models`, `/health`, dashboard)."""

    id: str  # the name responses carry in `model`, e.g. "SmolLM2-135M-Instruct.Q4_1"
    path: str
    size_bytes: int
    quantization: str  # e.g. "Q4_1"
    n_ctx_train: int
    ctx_per_slot: int
    n_slots: int
    backend: str  # "CPU", "CUDA", "Metal", ...
    n_gpu_layers: int
    embedding_dim: int
    has_chat_template: bool
    created: int  # unix time the model file was written, for /v1/models
    cpu_buffers: str = ""  # llama.cpp's extra CPU buffer types: "on (why)" or "off (why)"
    advice: str | None = None  # the command that fixes the build (toolchain/facts.py), if any
    gpu_fallback: str | None = None  # why a GPU build runs on the CPU (toolchain/facts.py)
    #: Branches of the shared-prefix context (a line each) besides the slots while it has
    #: work (0 while it has none, and on engines without one: engine/llama/contexts/shared.py).
    shared_branches: int = 0
    #: The model was loaded with a multimodal projector: chat and responses bodies may
    #: carry images (engine/llama/binding/vision.py).
    takes_images: bool = False

    @property
    def lane_sequences(self) -> int:
        """Lines the engine runs at once, in its slots and its branches: what the runner's
        claims keep it fed with."""
        return self.n_slots + self.shared_branches


@dataclass
class EngineStats:
    """Live figures for /metrics and the dashboard."""

    active_slots: int = 0
    queue_depth: int = 0
    tokens_per_second: float = 0.0  # generated tokens/s over the last few seconds
    prompt_tokens_total: int = 0
    completion_tokens_total: int = 0
    requests_total: dict[str, int] = field(default_factory=dict)  # outcome -> count
    images_encoded: int = 0  # image chunks the projector encoded (each distinct image once)

    def add(self, other: EngineStats) -> None:
        """Add another engine's figures to these (a registry's or a pool's total)."""
        self.active_slots += other.active_slots
        self.queue_depth += other.queue_depth
        self.tokens_per_second += other.tokens_per_second
        self.prompt_tokens_total += other.prompt_tokens_total
        self.completion_tokens_total += other.completion_tokens_total
        self.images_encoded += other.images_encoded
        for outcome, n in other.requests_total.items():
            self.requests_total[outcome] = self.requests_total.get(outcome, 0) + n


#: Called from the engine thread with each `chat.completion.chunk` (or `text_completion`
#: chunk) dict while a streamed request decodes. The final, whole response body still
#: arrives through the future.
ChunkCallback = Callable[[dict[str, Any]], None]


class Engine(Protocol):
    @property
    def info(self) -> ModelInfo:
        """The model's figures (a registry's is its first member's; it changes as they do)."""
        ...

    def submit(
        self,
        endpoint: str,
        body: dict[str, Any],
        *,
        priority: Priority = Priority.ONLINE,
        on_chunk: ChunkCallback | None = None,
    ) -> Future[dict[str, Any]]:
        """Queue one request. Thread-safe, returns at once.

        `endpoint` is one of ENDPOINTS; `body` the OpenAI request body. The future
        resolves to the OpenAI response body (`chat.completion`, `text_completion`, an
        embeddings `list` or a `response`, each with `usage`) or fails with `EngineError`.
        For RESPONSES, `on_chunk` gets the Responses stream events (each with its `type`).
        """
        ...

    def cancel(self, future: Future[dict[str, Any]]) -> None:
        """Withdraw a request: a queued one never runs, a running one frees its slot.
        Its future fails with RequestCancelled. A finished one is left alone."""
        ...

    def stats(self) -> EngineStats: ...

    def prompt_tokens(self, endpoint: str, body: dict[str, Any]) -> int | None:
        """The request's prompt tokens by its model's own tokenizer, where that model is
        loaded here now; None where the engine cannot count them (an upstream's model, a
        model on disk). Counting never loads a model."""
        ...

    def image_form(self, model: str | None) -> tuple[str, int]:
        """How images reach the engine that answers `model` (a request's, None where it
        names none): `png` (the embedded engine's:
        PNG and JPEG data URLs), an upstream's `images=` (`pass`, `inline` or `png`), and
        the longest side it takes (`image_max_side=`; 0: any). app/images puts them so."""
        ...

    def close(self) -> None:
        """Stop the engine thread and free the model. Pending futures fail."""
        ...


def resolve(
    future: Future[dict[str, Any]],
    *,
    result: dict[str, Any] | None = None,
    error: BaseException | None = None,
) -> bool:
    """Resolve a request's future once; whoever comes second (cancel vs finish) loses
    quietly. True if this call resolved it."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result or {})
    except InvalidStateError:
        return False
    return True
