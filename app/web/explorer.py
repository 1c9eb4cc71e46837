"""The batch page's results explorer, throughput chart, partial downloads and retry button.

Thin by rule: every handler calls one BatchService method (pages of lines, one line, the
lines finished so far, the progress series, retry) and renders a partial. The explorer is
paged by line number from the server, so a 50,000-line batch never lands in the page.
"""

from __future__ import annotations

import time
from typing import Any

from litestar import Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery
from litestar.response import Stream, Template

from app.batches import throughput
from app.batches.service import BatchService
from app.tables import Batch, BatchStatus
from app.web import views

#: Lines in one page of the explorer.
LINES_PAGE = 50


def explorer_context(
    batches: BatchService,
    batch_id: str,
    owner: str,
    status: str = "all",
    q: str = "",
    after: int = 0,
) -> dict[str, Any]:
    """One page of lines for explorer_lines.html, with the filter counts."""
    page = batches.lines(batch_id, owner, status=status, search=q, after=after, limit=LINES_PAGE)
    return {
        "batch_id": batch_id,
        "lines": [views.explorer_row(r) for r in page.rows],
        "has_more": page.has_more,
        "next_after": page.next_after,
        "after": after,
        "status": status,
        "q": q,
        "counts": batches.line_counts(batch_id, owner),
    }


def chart_context(batches: BatchService, batch: Batch, now: float | None = None) -> dict[str, Any]:
    """The throughput chart of a batch's whole life, from its finished lines."""
    now = time.time() if now is None else now
    tp = throughput.of_batch(batch, batches.progress_series(batch.id, batch.owner), now)
    projection = batches.runner.projections.get(batch.id)
    if tp.eta is not None and projection is not None and projection.finish_at is not None:
        # One ETA on the page: the runner's projection (its share among the other batches).
        tp.eta = max(0.0, projection.finish_at - now)
    return {
        "chart": views.throughput_chart(tp),
        "chart_running": batch.status in BatchStatus.ACTIVE,
    }


@get(
    "/web/batches/{batch_id:str}/lines",
    name="web:explorer_lines",
    sync_to_thread=True,
)
def explorer_lines(
    batches: NamedDependency[BatchService],
    owner: NamedDependency[str],
    batch_id: FromPath[str],
    status: FromQuery[str] = "all",
    q: FromQuery[str] = "",
    after: FromQuery[int] = 0,
) -> Template:
    context = explorer_context(batches, batch_id, owner, status, q.strip(), after)
    return Template(
        template_name="partials/explorer_lines.html", context={"explorer": context, "oob": True}
    )


@get(
    "/web/batches/{batch_id:str}/lines/{line:int}",
    name="web:explorer_line",
    sync_to_thread=True,
)
def explorer_line(
    batches: NamedDependency[BatchService],
    owner: NamedDependency[str],
    batch_id: FromPath[str],
    line: FromPath[int],
) -> Template:
    detail = views.line_detail(batches.line(batch_id, owner, line))
    return Template(
        template_name="partials/line_detail.html",
        context={"d": detail, "batch_id": batch_id},
    )


@get(
    "/web/batches/{batch_id:str}/chart",
    name="web:throughput_chart",
    sync_to_thread=True,
)
def chart(
    batches: NamedDependency[BatchService], owner: NamedDependency[str], batch_id: FromPath[str]
) -> Template:
    context = chart_context(batches, batches.get(batch_id, owner))
    return Template(template_name="partials/throughput_chart.html", context=context)


@get(
    "/batches/{batch_id:str}/finished/{kind:str}",
    name="web:finished_output",
    sync_to_thread=True,
)
def finished_output(
    batches: NamedDependency[BatchService],
    owner: NamedDependency[str],
    batch_id: FromPath[str],
    kind: FromPath[str],
) -> Stream:
    """What has finished so far, as the output (or error) file will hold it; while it runs."""
    chunks = batches.finished_output(batch_id, owner, kind)
    return Stream(
        chunks,
        media_type="application/jsonl",
        headers={"content-disposition": f'attachment; filename="{batch_id}_{kind}_so_far.jsonl"'},
    )


@post(
    "/web/batches/{batch_id:str}/retry",
    name="web:retry",
    sync_to_thread=True,
    status_code=200,
)
def retry(
    batches: NamedDependency[BatchService], owner: NamedDependency[str], batch_id: FromPath[str]
) -> Response[str]:
    """A new batch of the failed lines; the browser goes to its page."""
    new = batches.retry(batch_id, owner)
    return Response(
        f'<p class="notice">Retrying as <a href="/batches/{new.id}">{new.id}</a>.</p>',
        media_type="text/html",
        headers={"HX-Redirect": f"/batches/{new.id}"},
    )


#: The htmx fragments (app/web/routes.py renders their refusals inline).
FRAGMENTS = [explorer_lines, explorer_line, chart, retry]
#: A link the browser downloads: its refusal is the API's JSON error.
DOWNLOADS = [finished_output]
