"""Dashboard controllers: pages, htmx partials and the server-sent event streams.

Thin by rule: each handler parses, calls the same services the OpenAI API uses
(`FileService`, `BatchService`, `receive_upload`), and renders a template.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from litestar import Request, delete, get, post
from litestar.datastructures import State
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromPath, FromQuery
from litestar.response import File as FileResponse
from litestar.response import Response, ServerSentEvent, Template
from litestar.response.sse import ServerSentEventMessage

from app.api.common import Services, owner
from app.errors import APIError
from app.models import BatchStatus
from app.web import views
from app.web.preview import preview_file
from app.web.queries import batches_by_ids

#: Seconds between two looks at the database in a live stream.
TICK = 1.0
PAGE_SIZE = 20
RESULTS_SHOWN = 50


# -- helpers -------------------------------------------------------------------------------


def services(state: State) -> Services:
    return state.services  # type: ignore[no-any-return]


def owner_of(request: Request[Any, Any, Any]) -> str:
    """Whose files and batches the dashboard shows: the same owner the API would use."""
    return owner(request)


def render(request: Request[Any, Any, Any], name: str, **context: Any) -> str:
    """A partial as a string (for SSE data and out-of-band pieces)."""
    return request.app.template_engine.get_template(name).render(request=request, **context)


def base_url(request: Request[Any, Any, Any]) -> str:
    return str(request.base_url).rstrip("/")


def finished(status: str) -> bool:
    return status in BatchStatus.FINISHED


def batch_list_context(request: Request[Any, Any, Any], after: str | None) -> dict[str, Any]:
    batches, has_more = services(request.app.state).batches.list(
        owner_of(request), limit=PAGE_SIZE, after=after
    )
    rows = [views.batch_row(b) for b in batches]
    return {
        "rows": rows,
        "has_more": has_more,
        "next_after": batches[-1].id if batches and has_more else None,
        "after": after,
        "live_ids": ",".join(r["id"] for r in rows if r["running"]),
        "base_url": base_url(request),
    }


def batch_page_context(request: Request[Any, Any, Any], batch_id: str) -> dict[str, Any]:
    svc = services(request.app.state)
    owner = owner_of(request)
    batch = svc.batches.get(batch_id, owner)
    tracker = views.Throughput()
    if svc.engine is not None and not finished(batch.status):
        tracker.add(batch, engine_tps=svc.engine.stats().tokens_per_second)
    return {
        "row": views.batch_row(batch, tracker),
        "batch": svc.batches.to_openai(batch),
        "timeline": views.timeline(svc.batches.to_openai(batch)),
        "results": results_rows(request, batch_id),
        "live": not finished(batch.status),
    }


def results_rows(request: Request[Any, Any, Any], batch_id: str) -> list[dict[str, Any]]:
    svc = services(request.app.state)
    return [
        views.result_row(r)
        for r in svc.batches.results(batch_id, owner_of(request), limit=RESULTS_SHOWN)
    ]


def parse_metadata(text: str) -> dict[str, str] | None:
    """'key: value' (or key=value) per line, as OpenAI's batch metadata."""
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        sep = ":" if ":" in line else "=" if "=" in line else None
        if sep is None:
            raise APIError(
                400,
                f"Metadata line {number} needs a key and a value: 'key: value'.",
                param="metadata",
            )
        key, value = (part.strip() for part in line.split(sep, 1))
        if not key:
            raise APIError(400, f"Metadata line {number} has no key.", param="metadata")
        out[key] = value
    return out or None


# -- pages ---------------------------------------------------------------------------------


@get("/", name="web:home", sync_to_thread=True, include_in_schema=False)
def home(request: Request[Any, Any, Any], after: FromQuery[str | None] = None) -> Template:
    return Template(template_name="home.html", context=batch_list_context(request, after))


@get("/batches/{batch_id:str}", name="web:batch", sync_to_thread=True, include_in_schema=False)
def batch_page(request: Request[Any, Any, Any], batch_id: FromPath[str]) -> Template:
    try:
        context = batch_page_context(request, batch_id)
    except APIError as exc:
        return Template(
            template_name="error.html", context={"error": exc}, status_code=exc.status_code
        )
    return Template(template_name="batch.html", context=context)


@get("/files", name="web:files", sync_to_thread=True, include_in_schema=False)
def files_page(request: Request[Any, Any, Any], after: FromQuery[str | None] = None) -> Template:
    files, has_more = services(request.app.state).files.list(
        owner_of(request), limit=50, after=after
    )
    return Template(
        template_name="files.html",
        context={
            "files": [views.file_row(f) for f in files],
            "has_more": has_more,
            "next_after": files[-1].id if files and has_more else None,
            "base_url": base_url(request),
        },
    )


@get("/models", name="web:models", include_in_schema=False)
async def models_page(request: Request[Any, Any, Any]) -> Template:
    engine = services(request.app.state).engine
    if engine is None:  # the model is still loading (or failed to load: /health says why)
        failure = getattr(request.app.state, "engine_failure", None)
        return Template(template_name="models.html", context={"info": None, "failure": failure})
    return Template(
        template_name="models.html",
        context={
            "info": engine.info,
            "size": views.size(engine.info.size_bytes),
            "stats": engine.stats(),
        },
    )


@get(
    "/files/{file_id:str}/download",
    name="web:download",
    sync_to_thread=True,
    include_in_schema=False,
)
def download(request: Request[Any, Any, Any], file_id: FromPath[str]) -> FileResponse:
    row, path = services(request.app.state).files.content_path(file_id, owner_of(request))
    return FileResponse(
        path=path,
        filename=row.filename,
        media_type="application/jsonl"
        if row.filename.endswith(".jsonl")
        else "application/octet-stream",
        content_disposition_type="attachment",
    )


# -- htmx partials -------------------------------------------------------------------------


@get("/web/upload", name="web:upload_form", include_in_schema=False)
async def upload_form() -> Template:
    return Template(template_name="partials/upload_form.html")


@post("/web/upload", name="web:upload", include_in_schema=False, request_max_body_size=None)
async def upload(request: Request[Any, Any, Any]) -> Template:
    """Store the dropped file through the same path as POST /v1/files, then preview it."""
    from app.api.upload import receive_upload

    svc = services(request.app.state)
    owner = owner_of(request)
    try:
        row = await receive_upload(request, svc.files, owner)
        preview = await asyncio.to_thread(preview_file, svc.files, row.id, owner)
    except APIError as exc:
        return Template(template_name="partials/upload_error.html", context={"error": exc})
    return Template(
        template_name="partials/preview.html", context={"preview": preview, "error": None}
    )


@post("/web/batches", name="web:create_batch", sync_to_thread=True, include_in_schema=False)
def create_batch(
    request: Request[Any, Any, Any],
    data: Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)],
) -> Template:
    """Start a batch from a previewed file; the upload zone resets and the list shows it."""
    svc = services(request.app.state)
    owner = owner_of(request)
    file_id = data.get("file_id", "")
    try:
        metadata = parse_metadata(data.get("metadata", ""))
        batch = svc.batches.create(
            owner, file_id, data.get("endpoint", ""), completion_window="24h", metadata=metadata
        )
    except APIError as exc:
        try:
            preview = preview_file(svc.files, file_id, owner)
        except APIError:
            return Template(template_name="partials/upload_error.html", context={"error": exc})
        return Template(
            template_name="partials/preview.html",
            context={"preview": preview, "error": exc, "metadata": data.get("metadata", "")},
        )
    return Template(
        template_name="partials/started.html",
        context={"batch_id": batch.id, **batch_list_context(request, None)},
    )


@get("/web/batch-list", name="web:batch_list", sync_to_thread=True, include_in_schema=False)
def batch_list(request: Request[Any, Any, Any], after: FromQuery[str | None] = None) -> Template:
    return Template(
        template_name="partials/batch_list.html", context=batch_list_context(request, after)
    )


@post(
    "/web/batches/{batch_id:str}/cancel",
    name="web:cancel",
    sync_to_thread=True,
    include_in_schema=False,
)
def cancel(request: Request[Any, Any, Any], batch_id: FromPath[str]) -> Template:
    svc = services(request.app.state)
    error = None
    try:
        svc.batches.cancel(batch_id, owner_of(request))
    except APIError as exc:
        error = exc
    context = batch_page_context(request, batch_id)
    return Template(
        template_name="partials/batch_summary.html", context={**context, "error": error}
    )


@delete(
    "/web/files/{file_id:str}",
    name="web:delete_file",
    sync_to_thread=True,
    include_in_schema=False,
    status_code=200,
)
def delete_file(
    request: Request[Any, Any, Any], file_id: FromPath[str]
) -> Response[str] | Template:
    svc = services(request.app.state)
    owner = owner_of(request)
    try:
        svc.files.delete(file_id, owner)
    except APIError as exc:
        row = svc.files.get(file_id, owner)
        return Template(
            template_name="partials/file_row.html", context={"f": views.file_row(row), "error": exc}
        )
    return Response("", media_type="text/html")


# -- live streams --------------------------------------------------------------------------


def message(event: str, html: str) -> ServerSentEventMessage:
    return ServerSentEventMessage(event=event, data=html)


@get("/web/events/batches", name="web:list_events", include_in_schema=False)
async def list_events(request: Request[Any, Any, Any], ids: FromQuery[str] = "") -> ServerSentEvent:
    """Rows of the running batches in `ids`, sent when they change; ends when all finish."""
    wanted = [i for i in ids.split(",") if i][:PAGE_SIZE]
    svc = services(request.app.state)
    owner = owner_of(request)

    async def stream() -> AsyncIterator[ServerSentEventMessage]:
        trackers = {i: views.Throughput() for i in wanted}
        sent: dict[str, str] = {}
        active = set(wanted)
        while active:
            rows = await asyncio.to_thread(batches_by_ids, svc.db, owner, sorted(active))
            now = time.time()
            for batch_id in sorted(active):
                batch = rows.get(batch_id)
                if batch is None:
                    active.discard(batch_id)
                    continue
                trackers[batch_id].add(batch, now)
                html = render(
                    request,
                    "partials/batch_row.html",
                    r=views.batch_row(batch, trackers[batch_id], now),
                )
                if sent.get(batch_id) != html:
                    sent[batch_id] = html
                    yield message(f"row-{batch_id}", html)
                if finished(batch.status):
                    active.discard(batch_id)
            if active:
                await asyncio.sleep(TICK)
        yield message("done", "")

    return ServerSentEvent(stream())


@get("/web/events/batch/{batch_id:str}", name="web:batch_events", include_in_schema=False)
async def batch_events(request: Request[Any, Any, Any], batch_id: FromPath[str]) -> ServerSentEvent:
    """The batch page's summary (and its results table when lines finish) until it is done."""
    svc = services(request.app.state)
    owner = owner_of(request)

    async def stream() -> AsyncIterator[ServerSentEventMessage]:
        tracker = views.Throughput()
        sent_summary = sent_results = ""
        seen_done = -1
        while True:
            batch = await asyncio.to_thread(svc.batches.get, batch_id, owner)
            now = time.time()
            engine_tps = svc.engine.stats().tokens_per_second if svc.engine is not None else None
            tracker.add(batch, now, engine_tps)
            openai_batch = svc.batches.to_openai(batch)
            context = {
                "row": views.batch_row(batch, tracker, now),
                "batch": openai_batch,
                "timeline": views.timeline(openai_batch, now),
                "live": not finished(batch.status),
            }
            html = render(request, "partials/batch_summary.html", **context)
            if html != sent_summary:
                sent_summary = html
                yield message("summary", html)
            done = batch.completed + batch.failed
            if done != seen_done or finished(batch.status):
                seen_done = done
                rows = await asyncio.to_thread(results_rows, request, batch_id)
                html = render(request, "partials/results.html", results=rows, batch=openai_batch)
                if html != sent_results:
                    sent_results = html
                    yield message("results", html)
            if finished(batch.status):
                break
            await asyncio.sleep(TICK)
        yield message("done", "")

    return ServerSentEvent(stream())


@get("/web/events/engine", name="web:engine_events", include_in_schema=False)
async def engine_events(request: Request[Any, Any, Any]) -> ServerSentEvent:
    """The engine's live figures once a second, for as long as the page is open."""
    svc = services(request.app.state)

    async def stream() -> AsyncIterator[ServerSentEventMessage]:
        sent = ""
        while True:
            engine = svc.engine
            if engine is None:
                await asyncio.sleep(TICK)
                continue
            html = render(
                request, "partials/engine_stats.html", stats=engine.stats(), info=engine.info
            )
            if html != sent:
                sent = html
                yield message("stats", html)
            await asyncio.sleep(TICK)

    return ServerSentEvent(stream())


def web_route_handlers() -> list[Any]:
    """Every dashboard route, for create_app to include."""
    return [
        home,
        batch_page,
        files_page,
        models_page,
        download,
        upload_form,
        upload,
        create_batch,
        batch_list,
        cancel,
        delete_file,
        list_events,
        batch_events,
        engine_events,
    ]
