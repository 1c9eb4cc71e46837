"""Dashboard pages: the batch list, one batch, files, the engines; and file downloads.

Thin by rule: each handler calls the same services the OpenAI API uses and renders a
template. The contexts built here are shared with the partials and the live streams.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery
from litestar.response import File as FileResponse
from litestar.response import Template

from app.batches.claims.health import queue_health
from app.batches.claims.projection import Projection
from app.batches.service import BatchService
from app.engine.node import lanes, members
from app.errors import APIError
from app.files.download import file_download
from app.files.service import FileService
from app.services import Services
from app.tables import Batch, BatchStatus
from app.web import views
from app.web.explorer import chart_context, explorer_context
from app.web.models import batch_model
from app.wire.batches import batch_object
from app.wire.common import to_builtins

PAGE_SIZE = 20
FILES_PAGE_SIZE = 50


def base_url(request: Request[Any, Any, Any]) -> str:
    return str(request.base_url).rstrip("/")


def batch_list_context(
    request: Request[Any, Any, Any],
    batches: NamedDependency[BatchService],
    owner: NamedDependency[str],
    after: str | None,
) -> dict[str, Any]:
    rows_, has_more = batches.list(owner, limit=PAGE_SIZE, after=after)
    projections = batches.runner.projections.current()
    rows = [views.batch_row(b, projection=projections.get(b.id)) for b in rows_]
    return {
        "rows": rows,
        "has_more": has_more,
        "next_after": rows_[-1].id if rows_ and has_more else None,
        "after": after,
        "live_ids": ",".join(r["id"] for r in rows if r["running"]),
        "base_url": base_url(request),
    }


def summary_context(
    batch: Batch,
    tracker: views.RateTracker,
    now: float | None = None,
    model: dict[str, Any] | None = None,
    projection: Projection | None = None,
) -> dict[str, Any]:
    """What batch_summary.html needs; `model` is models.batch_model's, `projection` the
    runner's (projection.py)."""
    wire = to_builtins(batch_object(batch))
    return {
        "model": model,
        "row": views.batch_row(batch, tracker, now, projection),
        "batch": wire,
        "timeline": views.timeline(wire, now),
        "live": batch.status not in BatchStatus.FINISHED,
    }


def deliveries_context(services: Services, batch_id: str, owner: str) -> dict[str, Any]:
    """What partials/webhook_deliveries.html needs: the batch's webhook deliveries."""
    rows = [views.delivery_row(d) for d in services.webhooks.deliveries(batch_id, owner)]
    return {
        "batch_id": batch_id,
        "deliveries": rows,
        "deliveries_pending": any(r["status"] == "pending" for r in rows),
        "webhooks_enabled": services.webhooks.enabled,
    }


def batch_page_context(
    services: NamedDependency[Services],
    batch_id: FromPath[str],
    owner: NamedDependency[str],
    *,
    status: str = "all",
    q: str = "",
    after: int = 0,
    line: int | None = None,
) -> dict[str, Any]:
    """The batch page: its summary, throughput chart, and one page of the results explorer
    (filtered as the query says, with `line` opened)."""
    batch = services.batches.get(batch_id, owner)
    tracker = views.RateTracker()
    if services.engine is not None and batch.status not in BatchStatus.FINISHED:
        tracker.add(batch, engine_tps=services.engine.stats().tokens_per_second)
    try:
        explorer = explorer_context(
            services.batches, batch_id, owner, status=status, q=q, after=after
        )
    except APIError:  # a hand-edited query: show the first page unfiltered
        explorer = explorer_context(services.batches, batch_id, owner)
    opened = None
    if line is not None:
        try:
            opened = views.line_detail(services.batches.line(batch_id, owner, line))
        except APIError:
            opened = None
    return {
        **summary_context(
            batch,
            tracker,
            model=batch_model(services, batch),
            projection=services.runner.projections.get(batch.id),
        ),
        **chart_context(services.batches, batch),
        "explorer": explorer,
        "opened": opened,
        **deliveries_context(services, batch_id, owner),
    }


@get("/", name="web:home", sync_to_thread=True)
def home(
    request: Request[Any, Any, Any],
    batches: NamedDependency[BatchService],
    owner: NamedDependency[str],
    after: FromQuery[str | None] = None,
) -> Template:
    return Template(
        template_name="home.html", context=batch_list_context(request, batches, owner, after)
    )


@get("/batches/{batch_id:str}", name="web:batch", sync_to_thread=True)
def batch_page(
    services: NamedDependency[Services],
    owner: NamedDependency[str],
    batch_id: FromPath[str],
    *,
    status: FromQuery[str] = "all",
    q: FromQuery[str] = "",
    after: FromQuery[int] = 0,
    line: FromQuery[int | None] = None,
) -> Template:
    try:
        context = batch_page_context(
            services, batch_id, owner, status=status, q=q.strip(), after=after, line=line
        )
    except APIError as exc:
        return Template(
            template_name="error.html", context={"error": exc}, status_code=exc.status_code
        )
    return Template(template_name="batch.html", context=context)


@get("/files", name="web:files", sync_to_thread=True)
def files_page(
    request: Request[Any, Any, Any],
    files: NamedDependency[FileService],
    owner: NamedDependency[str],
    after: FromQuery[str | None] = None,
) -> Template:
    rows, has_more = files.list(owner, limit=FILES_PAGE_SIZE, after=after)
    return Template(
        template_name="files.html",
        context={
            "files": [views.file_row(f) for f in rows],
            "has_more": has_more,
            "next_after": rows[-1].id if rows and has_more else None,
            "base_url": base_url(request),
        },
    )


@get("/engines", name="web:engines", sync_to_thread=True)
def engines_page(services: NamedDependency[Services], owner: NamedDependency[str]) -> Template:
    """Each engine: its models, health, load and throughput, and which node runs what (the
    live part comes by SSE)."""
    return Template(template_name="engines.html", context=engines_context(services, owner))


def engines_context(services: Services, owner: str) -> dict[str, Any]:
    """What the engines page and its live partial show; no engines while the model loads.
    Blocking (it reads the database): call it from a thread."""
    engines = members(services.engine)
    return {
        "engines": engines,
        "failure": services.engine_failure,
        "sizes": {e.name: views.size(e.info.size_bytes) for e in engines},
        "total": services.engine.stats() if services.engine is not None else None,
        "nodes": services.batches.nodes_at_work(owner),
        "queue": queue_health(
            services.db, lanes(services.engine) if services.engine is not None else []
        ),
    }


@get(
    "/files/{file_id:str}/download",
    name="web:download",
    sync_to_thread=True,
)
def download(
    files: NamedDependency[FileService], owner: NamedDependency[str], file_id: FromPath[str]
) -> FileResponse:
    """The same download as `GET /v1/files/{id}/content` (app/files/download.py)."""
    return file_download(files, owner, file_id)


HANDLERS = [home, batch_page, files_page, engines_page, download]
