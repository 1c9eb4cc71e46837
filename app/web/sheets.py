"""The dashboard's sheet form: a dropped CSV, TSV or XLSX becomes a batch, and a finished
sheet batch comes back as a CSV or an XLSX.

Thin by rule: each handler reads the form and calls `SheetService` (app/sheets/), which
creates the batch through the same services as the API.
"""

from __future__ import annotations

import functools
import secrets
from typing import Any

import anyio.to_thread
from litestar import Request, get, post
from litestar.background_tasks import BackgroundTask
from litestar.datastructures import FormMultiDict
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery
from litestar.response import File as FileResponse
from litestar.response import Response, Template

from app.engine.node import members, model_pool
from app.errors import invalid
from app.services import Services
from app.sheets.images import image_column
from app.sheets.requests import COLUMN_TYPES, ENDPOINT, IMAGE_NAME, OutputColumn, SheetSpec
from app.sheets.writing import FORMATS
from app.tables import BatchStatus
from app.web.models import model_choices
from app.web.pages import batch_list_context
from app.web.thumbnails import content_views

#: Output-column rows the form starts with (more come with "Add an output column").
FORM_OUTPUT_ROWS = 2
XLSX_MEDIA_TYPE = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"


def model_ids(services: Services) -> list[str]:
    """The models the form offers: the catalog's (as "Run with" offers them), then any other
    id `GET /v1/models` lists (an upstream's)."""
    ids = model_choices(services)
    for engine in members(services.engine):
        ids.extend(m for m in engine.models if m not in ids)
    return ids


def sheet_form_context(
    services: Services, file_id: str, owner: str, sheet: str | None = None
) -> dict[str, Any]:
    """What partials/sheet_form.html needs: the sheet's columns and first rows, the models.
    Blocking (it reads the sheet): call it from a thread."""
    look = services.sheets.look(file_id, owner, sheet)
    models = model_ids(services)
    images = image_column(look.columns, [cells for _, cells in look.rows])
    template = f"{{{{ {look.columns[0]} }}}}" if look.columns[0].isidentifier() else ""
    model = models[0] if models else ""
    if images is not None:  # a column of images: placed, and a model that sees offered
        where = images if images.isidentifier() else f'row["{images}"]'
        template = f"{{{{ {IMAGE_NAME}({where}) }}}}"
        model = next(iter(seeing_models(services)), model)
    return {
        "look": look,
        "models": models,
        "model": model,
        "image_column": images,
        "template": template,
        "column_types": COLUMN_TYPES,
        "output_rows": range(FORM_OUTPUT_ROWS),
    }


def seeing_models(services: Services) -> list[str]:
    """The catalog's models that take images (those with a projector), in the pool's order."""
    pool = model_pool(services.engine)
    if pool is None:
        return []
    return [v.entry.id for v in pool.views() if not v.entry.error and v.entry.takes_images]


def spec_from_form(form: FormMultiDict) -> SheetSpec:
    """The form's fields as a SheetSpec (output-column rows with no name are left out)."""
    # A form posted by hand may leave any of the three out.
    names, kinds = form.getall("col_name", []), form.getall("col_type", [])
    choices = form.getall("col_choices", [])
    columns = []
    for i, name in enumerate(names):
        if not str(name).strip():
            continue
        kind = str(kinds[i]) if i < len(kinds) else "text"
        listed = str(choices[i]) if i < len(choices) else ""
        columns.append(
            OutputColumn(
                str(name).strip(),
                kind,
                [c.strip() for c in listed.split(",") if c.strip()] if kind == "one of" else [],
            )
        )
    return SheetSpec(
        template=str(form.get("template", "")),
        system=str(form.get("system", "")),
        model=str(form.get("model", "")).strip(),
        max_tokens=_number(form.get("max_tokens"), int, "max_tokens"),
        temperature=_number(form.get("temperature"), float, "temperature"),
        output_columns=columns,
        sheet=str(form.get("sheet") or "") or None,
        # A checkbox: present ("on") when ticked, absent when not.
        keep_reasoning=bool(form.get("keep_reasoning")),
    )


def _number(value: Any, kind: type, param: str) -> Any:
    text = str(value or "").strip()
    if not text:
        return None
    try:
        return kind(text)
    except ValueError:
        raise invalid(f"{param} must be a number; got '{text}'.", param=param) from None


@get("/web/sheets/{file_id:str}/form", name="web:sheet_form")
async def sheet_form(
    services: NamedDependency[Services],
    owner: NamedDependency[str],
    file_id: FromPath[str],
    sheet: FromQuery[str | None] = None,
) -> Template:
    """The form again, on another sheet of the workbook."""
    context = await anyio.to_thread.run_sync(sheet_form_context, services, file_id, owner, sheet)
    return Template(template_name="partials/sheet_form.html", context=context)


@get("/web/sheets/output-column", name="web:sheet_output_column")
async def output_column_row() -> Template:
    return Template(
        template_name="partials/sheet_output_column.html",
        context={"column_types": COLUMN_TYPES},
    )


@post("/web/sheets/{file_id:str}/preview", name="web:sheet_preview")
async def sheet_preview(
    request: Request[Any, Any, Any],
    services: NamedDependency[Services],
    owner: NamedDependency[str],
    file_id: FromPath[str],
) -> Template:
    """The first requests as they will be sent, and the input tokens of the whole sheet."""
    spec = spec_from_form(await request.form())
    # The model's own tokenizer counts the first requests where that model is loaded.
    engine = services.engine
    preview = await anyio.to_thread.run_sync(
        services.sheets.preview,
        file_id,
        owner,
        spec,
        functools.partial(engine.prompt_tokens, ENDPOINT) if engine is not None else None,
    )
    # Each message's content as text and thumbnails (made here, off the event loop).
    shown = await anyio.to_thread.run_sync(
        lambda: [[content_views(m["content"]) for m in r.messages] for r in preview.requests]
    )
    return Template(
        template_name="partials/sheet_preview.html",
        context={"preview": preview, "shown": shown},
    )


@post("/web/sheets/{file_id:str}/start", name="web:sheet_start")
async def sheet_start(
    request: Request[Any, Any, Any],
    services: NamedDependency[Services],
    owner: NamedDependency[str],
    file_id: FromPath[str],
) -> Template:
    """Write the input file and create the batch; the upload zone then says so (a refusal
    is a sentence beside the button instead)."""
    spec = spec_from_form(await request.form())
    batch = await anyio.to_thread.run_sync(services.sheets.start, owner, file_id, spec)
    context = await anyio.to_thread.run_sync(
        batch_list_context, request, services.batches, owner, None
    )
    return Template(
        template_name="partials/started.html",
        context={"batch_id": batch.id, **context},
        headers={"HX-Retarget": "#upload-zone", "HX-Reswap": "innerHTML"},
    )


@get("/web/batches/{batch_id:str}/sheet", name="web:sheet_downloads", sync_to_thread=True)
def sheet_downloads(
    services: NamedDependency[Services], owner: NamedDependency[str], batch_id: FromPath[str]
) -> Template | Response[str]:
    """The batch page's "Download CSV / XLSX" (nothing for a batch not made from a sheet);
    it asks again every few seconds until the batch ends."""
    batch = services.batches.get(batch_id, owner)
    sheet = services.sheets.sheet_of(batch_id, owner)
    if sheet is None:
        return Response("", media_type="text/html")
    return Template(
        template_name="partials/sheet_downloads.html",
        context={
            "batch_id": batch_id,
            "sheet": sheet,
            "finished": batch.status in BatchStatus.FINISHED,
            "formats": FORMATS,
        },
    )


FRAGMENTS = [sheet_form, output_column_row, sheet_preview, sheet_start, sheet_downloads]


@get("/batches/{batch_id:str}/sheet/{fmt:str}", name="web:sheet_download", sync_to_thread=True)
def sheet_download(
    services: NamedDependency[Services],
    owner: NamedDependency[str],
    batch_id: FromPath[str],
    fmt: FromPath[str],
) -> FileResponse:
    """The finished batch as a sheet: written to tmp/, sent, then removed."""
    path = (
        services.storage.tmp_dir / f"sheet-{secrets.token_hex(8)}.{fmt if fmt in FORMATS else 'x'}"
    )
    try:
        with open(path, "wb") as fh:
            name = services.sheets.export(batch_id, owner, fmt, fh)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return FileResponse(
        path=path,
        filename=name,
        media_type="text/csv; charset=utf-8" if fmt == "csv" else XLSX_MEDIA_TYPE,
        background=BackgroundTask(path.unlink, missing_ok=True),
    )


PAGES = [sheet_download]
