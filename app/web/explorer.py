"""The batch page's results explorer, throughput chart, partial downloads and retry button.

Thin by rule: every handler calls one BatchService method (pages of lines, one line, the
lines finished so far, the progress series, retry) and renders a partial. The explorer is
paged by line number from the server, so a 50,000-line batch never lands in the page. Each
line shows its images beside its answer (app/web/thumbnails.py); a file's thumbnail is
served here too.
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
from app.errors import APIError
from app.files.service import FileService
from app.images import IMAGE_FILE_PURPOSES, ImageError
from app.tables import Batch, BatchStatus, Request
from app.web import views
from app.web.thumbnails import RowImages, line_images, thumbnail_bytes

#: Lines in one page of the explorer.
LINES_PAGE = 50
#: Input lines longer than this show no images in the explorer's rows (read once each).
ROW_LINE_BYTES = 4 * 1024 * 1024
#: What the explorer's rows have shown, by input file and line (process-wide, bounded).
ROW_IMAGES = RowImages()


def explorer_context(
    batches: BatchService,
    batch_id: str,
    owner: str,
    *,
    status: str = "all",
    q: str = "",
    after: int = 0,
) -> dict[str, Any]:
    """One page of lines for explorer_lines.html, with the filter counts."""
    page = batches.lines(batch_id, owner, status=status, search=q, after=after, limit=LINES_PAGE)
    images = row_images(batches, batches.get(batch_id, owner), page.rows)
    return {
        "batch_id": batch_id,
        "lines": [{**views.explorer_row(r), "images": images[r.line]} for r in page.rows],
        "has_images": any(images.values()),
        "has_more": page.has_more,
        "next_after": page.next_after,
        "after": after,
        "status": status,
        "q": q,
        "counts": batches.line_counts(batch_id, owner),
    }


def row_images(batches: BatchService, batch: Batch, rows: list[Request]) -> dict[int, Any]:
    """Each row's images (ImageViews), read from the input file once per line."""
    out: dict[int, Any] = {}
    for r in rows:
        out[r.line] = ROW_IMAGES.get(batch.input_file_id, r.line)
    missing = [r for r in rows if out[r.line] is None]
    if missing:
        for line, source in batches.inputs(batch, missing, ROW_LINE_BYTES).items():
            out[line] = line_images(source)
            ROW_IMAGES.put(batch.input_file_id, line, out[line])
    return out


def chart_context(batches: BatchService, batch: Batch, now: float | None = None) -> dict[str, Any]:
    """The throughput chart of a batch's whole life, from its finished lines."""
    now = time.time() if now is None else now
    projection = batches.runner.projections.get(batch.id)
    finish_at = projection.finish_at if projection is not None else None
    series = batches.progress_series(batch.id, batch.owner)
    tp = throughput.of_batch(batch, series, now, finish_at)
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
    *,
    status: FromQuery[str] = "all",
    q: FromQuery[str] = "",
    after: FromQuery[int] = 0,
) -> Template:
    context = explorer_context(batches, batch_id, owner, status=status, q=q.strip(), after=after)
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
    found = batches.line(batch_id, owner, line)
    detail = {**views.line_detail(found), "images": line_images(found.input)}
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


@get("/web/files/{file_id:str}/thumbnail", name="web:file_thumbnail", sync_to_thread=True)
def file_thumbnail(
    files: NamedDependency[FileService], owner: NamedDependency[str], file_id: FromPath[str]
) -> Response[bytes]:
    """A small picture of the owner's image file (purpose vision or user_data), for the
    sheet form's preview and the explorer; the browser keeps it (a file never changes)."""
    row = files.get(file_id, owner)
    if row.purpose not in IMAGE_FILE_PURPOSES or row.bytes > files.settings.max_image_bytes:
        raise APIError(404, f"The file '{file_id}' is not an image file.", code="not_an_image")
    with files.storage.open_file(file_id) as fh:
        data = fh.read(files.settings.max_image_bytes + 1)
    try:
        small, mime = thumbnail_bytes(data)
    except ImageError as exc:
        raise APIError(404, exc.message, code=exc.code) from None
    return Response(small, media_type=mime, headers={"cache-control": "private, max-age=86400"})


#: The htmx fragments (app/web/routers.py renders their refusals inline).
FRAGMENTS = [explorer_lines, explorer_line, chart, retry]
#: A link the browser downloads (or shows): its refusal is the API's JSON error.
DOWNLOADS = [finished_output, file_thumbnail]
