"""Dashboard partials for htmx: upload and preview, start, list, cancel, delete.

The upload takes the same streamed path as `POST /v1/files`, and starting a batch calls
the same `BatchService.create` as `POST /v1/batches`.
"""

from __future__ import annotations

from typing import Annotated, Any

import anyio.to_thread
from litestar import Request, delete, get, post
from litestar.di import NamedDependency
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromPath, FromQuery
from litestar.response import Response, Template

from app.batches.run_with import with_model
from app.batches.service import BatchService
from app.config.settings import OPENAI_WINDOW
from app.errors import APIError
from app.files.multipart import receive_upload
from app.files.service import FileService
from app.services import Services
from app.sheets.reading import is_sheet
from app.sheets.zips import is_zip
from app.web import views
from app.web.models import model_choices
from app.web.pages import batch_list_context, batch_page_context, deliveries_context
from app.web.preview import preview_file
from app.web.sheets import sheet_form_context


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


@get("/web/upload", name="web:upload_form")
async def upload_form() -> Template:
    return Template(template_name="partials/upload_form.html")


@post("/web/upload", name="web:upload", request_max_body_size=None)
async def upload(
    request: Request[Any, Any, Any],
    services: NamedDependency[Services],
    owner: NamedDependency[str],
) -> Template:
    """Store the dropped file through the same path as POST /v1/files, then preview it (a
    sheet opens the sheet form: app/web/sheets.py; a zip of images, or of a sheet and its
    images, becomes a sheet first: app/sheets/zips.py)."""
    files = services.files
    try:
        row = await receive_upload(request, files, owner)
        if is_zip(row.filename):
            row = await anyio.to_thread.run_sync(services.sheets.from_zip, row.id, owner)
        if is_sheet(row.filename):
            context = await anyio.to_thread.run_sync(sheet_form_context, services, row.id, owner)
            return Template(template_name="partials/sheet_form.html", context=context)
        preview = await anyio.to_thread.run_sync(preview_file, files, row.id, owner)
    except APIError as exc:
        return Template(template_name="partials/upload_error.html", context={"error": exc})
    return Template(
        template_name="partials/preview.html",
        context={
            "preview": preview,
            "error": None,
            "models": model_choices(services),
            "windows": list(services.settings.allowed_windows),
            "window": OPENAI_WINDOW,
        },
    )


@post("/web/batches", name="web:create_batch", sync_to_thread=True)
def create_batch(
    request: Request[Any, Any, Any],
    data: Annotated[dict[str, str], Body(media_type=RequestEncodingType.URL_ENCODED)],
    services: NamedDependency[Services],
    owner: NamedDependency[str],
) -> Template:
    """Start a batch from a previewed file; the upload zone resets and the list shows it."""
    files, batches = services.files, services.batches
    file_id, model = data.get("file_id", ""), data.get("model", "")
    window = data.get("completion_window") or OPENAI_WINDOW
    choices = model_choices(services)
    try:
        metadata = parse_metadata(data.get("metadata", ""))
        if model and model not in choices:
            raise APIError(400, f"The model '{model}' is not one this node has.", param="model")
        # "Run with": the batch runs on a copy of the file naming that model on every line.
        run_file = with_model(files, file_id, owner, model).id if model else file_id
        try:
            batch = batches.create(
                owner,
                run_file,
                data.get("endpoint", ""),
                completion_window=window,
                metadata=metadata,
            )
        except APIError:
            if run_file != file_id:
                files.delete(run_file, owner)
            raise
    except APIError as exc:
        try:
            preview = preview_file(files, file_id, owner)
        except APIError:
            return Template(template_name="partials/upload_error.html", context={"error": exc})
        return Template(
            template_name="partials/preview.html",
            context={
                "preview": preview,
                "error": exc,
                "metadata": data.get("metadata", ""),
                "models": choices,
                "model": model,
                "windows": list(services.settings.allowed_windows),
                "window": window,
            },
        )
    return Template(
        template_name="partials/started.html",
        context={"batch_id": batch.id, **batch_list_context(request, batches, owner, None)},
    )


@get("/web/batch-list", name="web:batch_list", sync_to_thread=True)
def batch_list(
    request: Request[Any, Any, Any],
    batches: NamedDependency[BatchService],
    owner: NamedDependency[str],
    after: FromQuery[str | None] = None,
) -> Template:
    return Template(
        template_name="partials/batch_list.html",
        context=batch_list_context(request, batches, owner, after),
    )


@post(
    "/web/batches/{batch_id:str}/cancel",
    name="web:cancel",
    sync_to_thread=True,
)
def cancel(
    services: NamedDependency[Services], owner: NamedDependency[str], batch_id: FromPath[str]
) -> Template:
    error = None
    try:
        services.batches.cancel(batch_id, owner)
    except APIError as exc:
        error = exc
    context = batch_page_context(services, batch_id, owner)
    return Template(
        template_name="partials/batch_summary.html", context={**context, "error": error}
    )


@delete(
    "/web/files/{file_id:str}",
    name="web:delete_file",
    sync_to_thread=True,
    status_code=200,
)
def delete_file(
    files: NamedDependency[FileService], owner: NamedDependency[str], file_id: FromPath[str]
) -> Response[str] | Template:
    try:
        files.delete(file_id, owner)
    except APIError as exc:
        row = files.get(file_id, owner)
        return Template(
            template_name="partials/file_row.html", context={"f": views.file_row(row), "error": exc}
        )
    return Response("", media_type="text/html")


@get(
    "/web/batches/{batch_id:str}/webhooks",
    name="web:webhook_deliveries",
    sync_to_thread=True,
)
def webhook_deliveries(
    services: NamedDependency[Services], owner: NamedDependency[str], batch_id: FromPath[str]
) -> Template:
    services.batches.get(batch_id, owner)  # 404 for another owner's batch
    return Template(
        template_name="partials/webhook_deliveries.html",
        context=deliveries_context(services, batch_id, owner),
    )


@post(
    "/web/webhooks/{delivery_id:str}/redeliver",
    name="web:redeliver",
    sync_to_thread=True,
    status_code=200,
)
def redeliver(
    services: NamedDependency[Services], owner: NamedDependency[str], delivery_id: FromPath[str]
) -> Template:
    """Send a batch's webhook event again (same event id), then show its deliveries."""
    row = services.webhooks.redeliver(delivery_id, owner)
    return Template(
        template_name="partials/webhook_deliveries.html",
        context=deliveries_context(services, row.batch_id, owner),
    )


HANDLERS = [
    upload_form,
    upload,
    create_batch,
    batch_list,
    cancel,
    delete_file,
    webhook_deliveries,
    redeliver,
]
