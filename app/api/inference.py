"""The synchronous endpoints: chat completions, completions, embeddings, models, health.

They share the engine with the batch runner and go ahead of batch lines in its queue.
Their bodies go to the engine as sent: it checks every parameter and names it in its
error (the Structs in schemas.py only describe them for /schema).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from litestar import get, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, JSONBody, SkipValidation
from litestar.response import Response, Stream

from app.api.errors import json_object_body
from app.api.openapi import errors
from app.api.schemas.inference import (
    ChatCompletion,
    ChatCompletionCreateParams,
    Completion,
    CompletionCreateParams,
    CreateEmbeddingResponse,
    EmbeddingCreateParams,
    EngineBody,
    Health,
    Model,
    ModelPage,
    model_card,
)
from app.engine.base import CHAT, COMPLETIONS, EMBEDDINGS, Engine, Priority
from app.errors import APIError, error_body
from app.services import Services

STREAM_NOTE = " With `stream: true` the answer is `text/event-stream`: one chunk per `data:` event, then `data: [DONE]`."


async def _run(engine: Engine, endpoint: str, body: dict[str, Any]) -> Any:
    if body.get("stream") and endpoint != EMBEDDINGS:
        return _stream(engine, endpoint, body)
    fut = engine.submit(endpoint, body, priority=Priority.ONLINE)
    try:
        return await asyncio.wrap_future(fut)
    except asyncio.CancelledError:
        engine.cancel(fut)  # the client went away: free the slot
        raise


def _stream(engine: Engine, endpoint: str, body: dict[str, Any]) -> Stream:
    """Relay the engine's chunks as server-sent events. The engine itself sends the
    usage-only chunk that `stream_options.include_usage` asks for."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    fut = engine.submit(
        endpoint,
        body,
        priority=Priority.ONLINE,
        on_chunk=lambda c: loop.call_soon_threadsafe(chunks.put_nowait, c),
    )
    fut.add_done_callback(lambda _: loop.call_soon_threadsafe(chunks.put_nowait, None))

    async def events() -> AsyncIterator[bytes]:
        try:
            while (chunk := await chunks.get()) is not None:
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            exc = fut.exception()
            if exc is not None:
                err = (
                    exc.to_body()
                    if isinstance(exc, APIError)
                    else error_body(str(exc), type="server_error")
                )
                yield b"data: " + json.dumps(err).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            if not fut.done():
                engine.cancel(fut)

    return Stream(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _answers(body: type) -> dict[int, ResponseSpec]:
    return {200: ResponseSpec(body, description="The answer."), **errors(503)}


@post(
    "/v1/chat/completions",
    operation_id="CreateChatCompletion",
    description="A chat completion from the loaded model." + STREAM_NOTE,
    status_code=200,
    before_request=json_object_body,
    responses=_answers(ChatCompletion),
)
async def chat_completions(
    data: JSONBody[Annotated[dict[str, Any], EngineBody(ChatCompletionCreateParams)]],
    engine: NamedDependency[SkipValidation[Engine]],
) -> Any:
    """Answer a chat (`messages`), whole or streamed."""
    return await _run(engine, CHAT, data)


@post(
    "/v1/completions",
    operation_id="CreateCompletion",
    description="A text completion of `prompt` from the loaded model." + STREAM_NOTE,
    status_code=200,
    before_request=json_object_body,
    responses=_answers(Completion),
)
async def completions(
    data: JSONBody[Annotated[dict[str, Any], EngineBody(CompletionCreateParams)]],
    engine: NamedDependency[SkipValidation[Engine]],
) -> Any:
    """Complete a prompt, whole or streamed."""
    return await _run(engine, COMPLETIONS, data)


@post(
    "/v1/embeddings",
    operation_id="CreateEmbedding",
    status_code=200,
    before_request=json_object_body,
    responses=_answers(CreateEmbeddingResponse),
)
async def embeddings(
    data: JSONBody[Annotated[dict[str, Any], EngineBody(EmbeddingCreateParams)]],
    engine: NamedDependency[SkipValidation[Engine]],
) -> Any:
    """Embed one input or a list of them."""
    return await _run(engine, EMBEDDINGS, data)


@get("/v1/models", operation_id="ListModels", responses=errors(503))
async def list_models(engine: NamedDependency[SkipValidation[Engine]]) -> ModelPage:
    """The one model this server serves."""
    return ModelPage(data=[model_card(engine.info)])


@get("/v1/models/{model_id:path}", operation_id="RetrieveModel", responses=errors(404, 503))
async def retrieve_model(
    engine: NamedDependency[SkipValidation[Engine]], model_id: FromPath[str]
) -> Model:
    """The model, if `model_id` names the one this server serves."""
    name = model_id.lstrip("/")
    if name != engine.info.id:
        raise APIError(
            404,
            f"The model '{name}' does not exist; this server serves '{engine.info.id}'.",
            param="model",
            code="model_not_found",
        )
    return model_card(engine.info)


@get(
    "/health",
    operation_id="Health",
    responses={503: ResponseSpec(Health, description="Starting, or failed to load the model.")},
)
async def health(services: NamedDependency[Services]) -> Response[Health]:
    """Ready (200) once the model is loaded; 503 while it loads or when it failed to."""
    engine = services.engine
    if engine is None:
        failure = services.engine_failure
        status = "failed" if failure else "starting"
        return Response(Health(status=status, error=failure), status_code=503)
    info = engine.info
    return Response(
        Health(
            status="ready",
            model=info.id,
            backend=info.backend,
            slots=info.n_slots,
            ctx_per_slot=info.ctx_per_slot,
            n_gpu_layers=info.n_gpu_layers,
            cpu_buffers=info.cpu_buffers or None,
            advice=info.advice,
        )
    )


ROUTES = [chat_completions, completions, embeddings, list_models, retrieve_model, health]
