"""The synchronous endpoints: chat completions, completions, embeddings, models, health.

They share the engine with the batch runner and go ahead of batch lines in its queue.
A chat answer's thought leaves under the name `--reasoning-field` gives (reasoning.present).
Their bodies go to the engine as sent: it checks every parameter and names it in its
error (the Structs in app/wire/inference.py only describe them for /schema). The images of a chat or
Responses body are read first, in a worker thread, into the form its engine takes
(app/images/): a bad image is the request's 400.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from concurrent.futures import Future
from typing import Annotated, Any, Literal, TypeVar

from litestar import Request, get, post
from litestar.di import NamedDependency
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import FromPath, JSONBody, SkipValidation
from litestar.response import Response, Stream
from litestar.types import Receive

from app.api.errors import json_object_body
from app.api.openapi import errors
from app.engine.base import Engine, Priority
from app.engine.node import members, model_cards
from app.engine.node import model_id as resolved_id
from app.engine.reasoning import present
from app.engine.tiers import service_tier
from app.errors import APIError, error_body
from app.images import has_images, target_for
from app.services import Services
from app.wire.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES
from app.wire.inference import (
    CatalogModel,
    ChatCompletion,
    ChatCompletionCreateParams,
    Completion,
    CompletionCreateParams,
    CreateEmbeddingResponse,
    EmbeddingCreateParams,
    EngineBody,
    EngineHealth,
    Health,
    HealthStatus,
    Model,
    ModelPage,
    ResponseCreateParams,
)
from app.wire.inference import Response as ResponseObject

STREAM_NOTE = " With `stream: true` the answer is `text/event-stream`: one chunk per `data:` event, then `data: [DONE]`."
T = TypeVar("T")

RESPONSES_STREAM_NOTE = (
    " With `stream: true` the answer is `text/event-stream`: the Responses events "
    "(`response.created`, `response.output_text.delta`, ..., `response.completed`), each as "
    "`event: <type>` and `data: <event>`."
)


def _service_tier(body: dict[str, Any]) -> tuple[dict[str, Any], Priority, str | None]:
    """The body without its `service_tier`, the priority that tier runs at, and the tier
    its answer names (None when the body named none); an unknown tier is a 400
    (app/engine/tiers.py)."""
    tier = service_tier(body.get("service_tier"))
    if tier is None:
        return body, Priority.ONLINE, None
    rest = {k: v for k, v in body.items() if k != "service_tier"}
    return rest, tier.priority, tier.named


def _leaving(answer: dict[str, Any], tier: str | None, field: str | None) -> dict[str, Any]:
    """A chat answer or chunk, or a Responses answer or event, as it leaves: naming the tier
    it ran at, and a chat answer's thought under `--reasoning-field` (`field`; None: not a
    chat answer)."""
    if field is not None and isinstance(answer, dict):
        present(answer, field)
    if tier is not None and isinstance(answer, dict):
        inner = answer.get("response")
        (inner if isinstance(inner, dict) else answer)["service_tier"] = tier
    return answer


async def _run(
    engine: Engine,
    endpoint: str,
    body: dict[str, Any],
    receive: Receive,
    *,
    priority: Priority = Priority.ONLINE,
    tier: str | None = None,
    field: str | None = None,
) -> Any:
    """`body`'s answer, whole or streamed; `field` is `--reasoning-field` for a chat answer."""
    if body.get("stream") and endpoint != EMBEDDINGS:
        return await _stream(
            engine, endpoint, body, receive, priority=priority, tier=tier, field=field
        )
    fut = engine.submit(endpoint, body, priority=priority)
    return _leaving(await _unless_gone(engine, fut, _settled(fut), receive), tier, field)


async def _with_images(
    services: Services, engine: Engine, endpoint: str, body: dict[str, Any], owner: str
) -> dict[str, Any]:
    """`body` with its images in the form of the engine its model routes to; as it is when
    it has none. A bad image is an ImageError (400), raised here."""
    if not has_images(endpoint, body):
        return body
    target = target_for(engine, body.get("model"))
    resolver = services.images
    resolved = await asyncio.to_thread(resolver.resolve, endpoint, body, target=target, owner=owner)
    return resolved.body


def _settled(fut: Future[dict[str, Any]]) -> asyncio.Future[dict[str, Any]]:
    """The engine's future as an asyncio one. Unlike `asyncio.wrap_future`, cancelling it
    never cancels `fut` itself: only `engine.cancel` may settle a request early, since that
    is what frees its slot or stops an upstream's retries."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[dict[str, Any]] = loop.create_future()

    def copy(done: Future[dict[str, Any]]) -> None:
        if waiter.done():
            return
        exc = done.exception()
        if exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(done.result())

    fut.add_done_callback(lambda done: loop.call_soon_threadsafe(copy, done))
    return waiter


async def _client_gone(receive: Receive) -> None:
    """Return once the client has closed its connection. The body is read by now, so the
    server's next message is `http.disconnect` (sent when the client goes, or after the
    answer: this watch is cancelled before that)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _unless_gone(
    engine: Engine, fut: Future[dict[str, Any]], answer: Awaitable[T], receive: Receive
) -> T:
    """Await `answer` (what the request `fut` yields) while watching the client. A client
    that gives up is not waited for: the request is withdrawn at once (an embedded slot
    freed, an upstream's retries stopped) and the answer is its 499 `request_cancelled`."""
    waiting = asyncio.ensure_future(answer)
    gone = asyncio.ensure_future(_client_gone(receive))
    try:
        await asyncio.wait((waiting, gone), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the server is stopping
        engine.cancel(fut)
        waiting.cancel()
        raise
    finally:
        gone.cancel()
    if not waiting.done():
        engine.cancel(fut)
    return await waiting


async def _stream(
    engine: Engine,
    endpoint: str,
    body: dict[str, Any],
    receive: Receive,
    *,
    priority: Priority = Priority.ONLINE,
    tier: str | None = None,
    field: str | None = None,
) -> Stream:
    """Relay the engine's chunks as server-sent events. The engine itself sends the
    usage-only chunk that `stream_options.include_usage` asks for. The answer starts with
    the first chunk: a request refused before any (a bad parameter, an upstream's 400) is
    answered with its error status, not a stream holding the error."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    def on_chunk(chunk: dict[str, Any]) -> None:
        loop.call_soon_threadsafe(chunks.put_nowait, _leaving(chunk, tier, field))

    fut = engine.submit(endpoint, body, priority=priority, on_chunk=on_chunk)
    fut.add_done_callback(lambda _: loop.call_soon_threadsafe(chunks.put_nowait, None))
    responses = endpoint == RESPONSES
    # Until the first chunk the client is watched as for a whole answer (an upstream may be
    # retrying); after it, the stream itself ends when the client goes (`finally` below).
    first = await _unless_gone(engine, fut, chunks.get(), receive)
    if first is None and isinstance(refused := fut.exception(), APIError):
        raise refused

    async def events() -> AsyncIterator[bytes]:
        sent = 0
        chunk = first
        try:
            while chunk is not None:
                sent += 1
                yield _sse(chunk, responses)
                chunk = await chunks.get()
            exc = fut.exception()
            if exc is not None:
                err = (
                    exc.to_body()
                    if isinstance(exc, APIError)
                    else error_body(str(exc), type="server_error")
                )
                if responses:  # the Responses stream's own error event
                    err = {"type": "error", "sequence_number": sent, **err["error"]}
                yield _sse(err, responses)
            if not responses:
                yield b"data: [DONE]\n\n"
        finally:
            if not fut.done():
                engine.cancel(fut)

    return Stream(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _sse(data: dict[str, Any], named: bool) -> bytes:
    """One server-sent event; Responses events also carry their type as the event name."""
    head = f"event: {data.get('type')}\n".encode() if named else b""
    return head + b"data: " + json.dumps(data).encode() + b"\n\n"


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
    services: NamedDependency[Services],
    owner: NamedDependency[str],
    request: Request[Any, Any, Any],
) -> Any:
    """Answer a chat (`messages`), whole or streamed; `service_tier: flex` at batch priority."""
    data, priority, tier = _service_tier(data)
    data = await _with_images(services, engine, CHAT, data, owner)
    field = services.settings.reasoning_field
    return await _run(
        engine, CHAT, data, request.receive, priority=priority, tier=tier, field=field
    )


@post(
    "/v1/responses",
    operation_id="CreateResponse",
    description="A model response to `input` (text or items, with function tools), run on the "
    "chat path. Responses are not stored: `previous_response_id` is refused; send the earlier "
    "turns in `input`." + RESPONSES_STREAM_NOTE,
    status_code=200,
    before_request=json_object_body,
    responses=_answers(ResponseObject),
)
async def create_response(
    data: JSONBody[Annotated[dict[str, Any], EngineBody(ResponseCreateParams)]],
    engine: NamedDependency[SkipValidation[Engine]],
    services: NamedDependency[Services],
    owner: NamedDependency[str],
    request: Request[Any, Any, Any],
) -> Any:
    """Answer a Responses request, whole or streamed; `service_tier: flex` at batch priority."""
    data, priority, tier = _service_tier(data)
    data = await _with_images(services, engine, RESPONSES, data, owner)
    return await _run(engine, RESPONSES, data, request.receive, priority=priority, tier=tier)


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
    request: Request[Any, Any, Any],
) -> Any:
    """Complete a prompt, whole or streamed."""
    return await _run(engine, COMPLETIONS, data, request.receive)


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
    request: Request[Any, Any, Any],
) -> Any:
    """Embed one input or a list of them."""
    return await _run(engine, EMBEDDINGS, data, request.receive)


def _cards(engine: Engine) -> list[Model]:
    # A catalog model's card says what loading it takes (its source, size, estimate).
    return [
        CatalogModel(**card) if "source" in card else Model(**card) for card in model_cards(engine)
    ]


@get("/v1/models", operation_id="ListModels", responses=errors(503))
async def list_models(engine: NamedDependency[SkipValidation[Engine]]) -> ModelPage:
    """Every engine's models: the embedded model, then each upstream's."""
    return ModelPage(data=_cards(engine))


@get("/v1/models/{model_id:path}", operation_id="RetrieveModel", responses=errors(404, 503))
async def retrieve_model(
    engine: NamedDependency[SkipValidation[Engine]], model_id: FromPath[str]
) -> Model:
    """The model `model_id` names, by the rule chat and batch lines read it by (an id, an
    alias, `name` for `name:latest`, letter case aside): its card, with its one id."""
    name = model_id.lstrip("/")
    cards = _cards(engine)
    ident = resolved_id(engine, name)
    for card in cards:
        if card.id == ident:
            return card
    known = ", ".join(f"'{c.id}'" for c in cards)
    raise APIError(
        404,
        f"The model '{name}' does not exist; this server serves {known}.",
        param="model",
        code="model_not_found",
    )


@get(
    "/health",
    operation_id="Health",
    responses={503: ResponseSpec(Health, description="Starting, or failed to load the model.")},
)
async def health(services: NamedDependency[Services]) -> Response[Health]:
    """Ready (200) once the model is loaded; 503 while it loads or when it failed to."""
    engine = services.engine
    node = services.runner.worker_id
    database: Literal["sqlite", "postgresql"] = "sqlite" if services.db.is_sqlite else "postgresql"
    if engine is None:
        failure = services.engine_failure
        status: HealthStatus = "failed" if failure else "starting"
        return Response(
            Health(status=status, node=node, database=database, error=failure), status_code=503
        )
    info = engine.info
    return Response(
        Health(
            status="ready",
            error=services.engine_failure,  # the embedded model's, while upstreams serve
            node=node,
            database=database,
            model=info.id,
            backend=info.backend,
            slots=info.n_slots,
            ctx_per_slot=info.ctx_per_slot,
            n_gpu_layers=info.n_gpu_layers,
            cpu_buffers=info.cpu_buffers or None,
            advice=info.advice,
            gpu_fallback=info.gpu_fallback,
            engines=[
                EngineHealth(name=m.name, kind=m.kind, up=m.up, models=m.models)
                for m in members(engine)
            ],
        )
    )


HANDLERS = [
    chat_completions,
    create_response,
    completions,
    embeddings,
    list_models,
    retrieve_model,
    health,
]
