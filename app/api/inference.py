"""The synchronous endpoints: chat completions, completions, embeddings, models, health.

They share the engine with the batch runner and go ahead of batch lines in its queue.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, get, post
from litestar.params import FromPath
from litestar.response import Response, Stream

from app.api.common import json_object, services
from app.engine.base import CHAT, COMPLETIONS, EMBEDDINGS, Engine, Priority
from app.errors import APIError


def ready_engine(request: Request) -> Engine:
    engine = services(request).engine
    if engine is None:
        raise APIError(
            503,
            "The model is still loading; try again in a few seconds.",
            code="model_loading",
            type="server_error",
        )
    return engine


async def _run(request: Request, endpoint: str) -> Any:
    body = await json_object(request)
    engine = ready_engine(request)
    if body.get("stream") and endpoint != EMBEDDINGS:
        return _stream(engine, endpoint, body)
    fut = engine.submit(endpoint, body, priority=Priority.ONLINE)
    try:
        return await asyncio.wrap_future(fut)
    except asyncio.CancelledError:
        engine.cancel(fut)  # the client went away: free the slot
        raise


def _stream(engine: Engine, endpoint: str, body: dict[str, Any]) -> Stream:
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    fut = engine.submit(
        endpoint,
        body,
        priority=Priority.ONLINE,
        on_chunk=lambda c: loop.call_soon_threadsafe(chunks.put_nowait, c),
    )
    fut.add_done_callback(lambda _: loop.call_soon_threadsafe(chunks.put_nowait, None))
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    async def events() -> AsyncIterator[bytes]:
        try:
            while (chunk := await chunks.get()) is not None:
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            exc = fut.exception()
            if exc is not None:
                err = (
                    exc.to_body()
                    if hasattr(exc, "to_body")
                    else {
                        "error": {
                            "message": str(exc),
                            "type": "server_error",
                            "param": None,
                            "code": None,
                        }
                    }
                )
                yield b"data: " + json.dumps(err).encode() + b"\n\n"
            elif include_usage:
                final = fut.result()
                tail = {
                    "id": final.get("id"),
                    "object": "chat.completion.chunk" if endpoint == CHAT else "text_completion",
                    "created": final.get("created"),
                    "model": final.get("model"),
                    "choices": [],
                    "usage": final.get("usage"),
                }
                yield b"data: " + json.dumps(tail).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            if not fut.done():
                engine.cancel(fut)

    return Stream(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request) -> Any:
    return await _run(request, CHAT)


@post("/v1/completions", status_code=200)
async def completions(request: Request) -> Any:
    return await _run(request, COMPLETIONS)


@post("/v1/embeddings", status_code=200)
async def embeddings(request: Request) -> Any:
    return await _run(request, EMBEDDINGS)


def _model_card(engine: Engine) -> dict[str, Any]:
    return {
        "id": engine.info.id,
        "object": "model",
        "created": engine.info.created,
        "owned_by": "batchyard",
    }


@get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    engine = ready_engine(request)
    return {"object": "list", "data": [_model_card(engine)]}


@get("/v1/models/{model_id:path}")
async def retrieve_model(request: Request, model_id: FromPath[str]) -> dict[str, Any]:
    engine = ready_engine(request)
    if model_id.lstrip("/") != engine.info.id:
        raise APIError(
            404,
            f"The model '{model_id.lstrip('/')}' does not exist; this server serves '{engine.info.id}'.",
            param="model",
            code="model_not_found",
        )
    return _model_card(engine)


@get("/health")
async def health(request: Request) -> Response[dict[str, Any]]:
    svc = services(request)
    engine = svc.engine
    if engine is None:
        failure = request.app.state.get("engine_failure")
        status = "failed" if failure else "starting"
        return Response({"status": status, "error": failure}, status_code=503)
    info = engine.info
    return Response(
        {
            "status": "ready",
            "model": info.id,
            "backend": info.backend,
            "slots": info.n_slots,
            "ctx_per_slot": info.ctx_per_slot,
            "n_gpu_layers": info.n_gpu_layers,
        }
    )


ROUTES = [chat_completions, completions, embeddings, list_models, retrieve_model, health]
