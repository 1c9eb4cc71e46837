"""Sheet batches: a stored sheet and a spec in, an ordinary batch out; its results back as
a sheet.

`start` reads the sheet row by row, writes the standard JSONL input file through
`FileService` and creates the batch through `BatchService`, the same calls as
`POST /v1/files` and `POST /v1/batches`; the sheet and its spec are kept in `sheetbatch`
for `export`, which joins the batch's output and error files back to the rows.
"""

from __future__ import annotations

import io
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO
from zipfile import ZipFile, ZipInfo

from app.batches.service import BatchService
from app.config import Settings
from app.db import Database
from app.errors import APIError, invalid
from app.files.service import FileService
from app.files.storage import Storage
from app.sheets.images import ImageCellError, ImageCells
from app.sheets.reading import SheetError, is_sheet, open_sheet
from app.sheets.requests import (
    ENDPOINT,
    RowTemplate,
    SheetSpec,
    check_output_columns,
    content_text,
    estimate_sheet_tokens,
    estimate_tokens,
    request_lines,
)
from app.sheets.writing import FORMATS, added_columns, joined_rows, write_csv, write_xlsx
from app.sheets.zips import (
    check_image_count,
    extract_sheet,
    image_cells,
    image_names,
    images_in_zip,
    open_zip,
    read_image,
    sheet_in_zip,
    sheet_name,
    sheet_of_images,
    write_sheet,
)
from app.tables import Batch, BatchStatus, File, SheetBatch

#: Rows the form shows of a sheet.
LOOK_ROWS = 5
#: Requests the form renders as a preview.
PREVIEW_REQUESTS = 3
#: The batch metadata key that names the sheet a batch was made from (as /v1/batches shows).
SHEET_METADATA_KEY = "sheet"
#: Sheets whose row count and column sizes are kept for the form's estimate.
STATS_KEPT = 32


@dataclass
class SheetStats:
    """A sheet's rows of data and the characters in each column: read once per sheet, so
    that the form's preview reads only its first rows at every keystroke."""

    rows: int
    chars: dict[str, int]


@dataclass
class SheetLook:
    """What the form shows of a stored sheet."""

    file: File
    columns: list[str]
    rows: list[tuple[int, list[str]]]
    sheet_names: list[str]
    sheet_name: str | None


@dataclass
class RequestPreview:
    row: int
    messages: list[dict[str, Any]]
    body: dict[str, object]


@dataclass
class SheetPreview:
    """The first requests as they will be sent, and the whole sheet's rows and tokens."""

    requests: list[RequestPreview]
    rows: int
    #: Input tokens of every row's messages, estimated: about four characters a token, or
    #: scaled by what the model's own tokenizer counts in the first requests.
    tokens: int
    #: The model whose tokenizer counted the first requests; None for four characters a token.
    counted_by: str | None = None
    #: Whether the requests carry images (their tokens are not in the estimate).
    images: bool = False


class SheetService:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        storage: Storage,
        files: FileService,
        batches: BatchService,
    ) -> None:
        self.settings = settings
        self.db = db
        self.storage = storage
        self.files = files
        self.batches = batches
        # (file id, sheet) -> stats; stored files never change, so nothing goes stale.
        self._stats: dict[tuple[str, str | None], SheetStats] = {}

    # -- the stored sheet -------------------------------------------------------------

    def store(self, source: BinaryIO, filename: str, owner: str) -> File:
        """Store a sheet (from `batchyard run`) as the dashboard's upload does: a File of
        purpose user_data."""
        if not is_sheet(filename):
            raise SheetError(f"'{filename}' is not a .csv, .tsv or .xlsx file.")
        return self.files.store(source, filename=filename, purpose="user_data", owner=owner)

    def from_zip(self, zip_id: str, owner: str) -> File:
        """The dashboard's zip (a stored file) as a sheet (app/sheets/zips.py): a zip of
        images becomes a CSV of their names and file ids; a zip of one sheet and its images
        becomes that sheet, each image cell's path replaced by the image's file id. Each
        image is a file of purpose `vision`. The zip itself is deleted once read; on a
        refusal nothing it held is kept."""
        row = self.files.get(zip_id, owner)
        made: list[File] = []
        names: list[str] = []  # as the zip names them, folders and all
        try:
            with self._local(zip_id) as path, open_zip(path) as archive:
                sheet = sheet_in_zip(archive)
                if sheet is not None:
                    return self._zip_sheet(archive, sheet, owner, made)
                for name, data in images_in_zip(
                    archive,
                    max_bytes=self.settings.max_image_bytes,
                    max_images=self.settings.max_requests_per_batch,
                ):
                    made.append(
                        self.files.store(
                            io.BytesIO(data), filename=name, purpose="vision", owner=owner
                        )
                    )
                    names.append(name)
            rows = [(name, f.id) for name, f in zip(names, made, strict=True)]
            return self.store(
                io.BytesIO(sheet_of_images(rows)), f"{Path(row.filename).stem}.csv", owner
            )
        except BaseException:
            for f in made:
                self.files.delete(f.id, owner)
            raise
        finally:
            self.files.delete(zip_id, owner)

    def _zip_sheet(self, archive: ZipFile, sheet: ZipInfo, owner: str, made: list[File]) -> File:
        """The zip's sheet with its image cells as file ids; each image it names stored
        once (appended to `made`, for the caller to delete on a refusal)."""
        limit = self.settings.max_requests_per_batch
        local = self.storage.tmp_dir / f"zip-sheet-{secrets.token_hex(8)}"
        written = local.with_name(local.name + "-out")
        try:
            extract_sheet(archive, sheet, local, max_bytes=self.settings.max_file_bytes)
            cells = image_cells(local, sheet.filename, set(image_names(archive)), max_rows=limit)
            named = sorted(set(cells.values()))
            check_image_count(len(named), limit, f"The sheet '{sheet.filename}' names")
            ids: dict[str, str] = {}
            for name in named:
                data = read_image(archive, name, max_bytes=self.settings.max_image_bytes)
                made.append(
                    self.files.store(io.BytesIO(data), filename=name, purpose="vision", owner=owner)
                )
                ids[name] = made[-1].id
            with open(written, "wb") as out:
                write_sheet(local, sheet.filename, {c: ids[n] for c, n in cells.items()}, out)
            with open(written, "rb") as src:
                return self.store(src, sheet_name(sheet.filename), owner)
        finally:
            local.unlink(missing_ok=True)
            written.unlink(missing_ok=True)

    def _sheet_file(self, file_id: str, owner: str) -> File:
        row = self.files.get(file_id, owner)
        if not is_sheet(row.filename):
            raise invalid(
                f"The file '{file_id}' ({row.filename}) is not a .csv, .tsv or .xlsx sheet.",
                param="file_id",
            )
        return row

    @contextmanager
    def _local(self, file_id: str) -> Iterator[Path]:
        """The file's bytes as a local path (a copy in tmp/ when they live in a bucket)."""
        path = self.storage.local_path(file_id)
        if path is not None:
            yield path
            return
        copy = self.storage.tmp_dir / f"sheet-{secrets.token_hex(8)}"
        try:
            with self.storage.open_file(file_id) as src, open(copy, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            yield copy
        finally:
            copy.unlink(missing_ok=True)

    def look(self, file_id: str, owner: str, sheet: str | None = None) -> SheetLook:
        """The sheet's columns and first rows, for the form."""
        row = self._sheet_file(file_id, owner)
        with self._local(file_id) as path, open_sheet(path, row.filename, sheet=sheet) as opened:
            rows = []
            for item in opened.rows:
                rows.append(item)
                if len(rows) >= LOOK_ROWS:
                    break
            return SheetLook(row, opened.columns, rows, opened.sheet_names, opened.sheet_name)

    def preview(
        self,
        file_id: str,
        owner: str,
        spec: SheetSpec,
        count: Callable[[dict[str, Any]], int | None] | None = None,
    ) -> SheetPreview:
        """The first requests as they will be sent, and an estimate of the input tokens of
        the whole sheet (from `stats`, read once per sheet). `count` gives a request body's
        prompt tokens by the model's own tokenizer where it is loaded (else None): the
        estimate is then scaled by its count of the first requests against theirs in
        characters."""
        row = self._sheet_file(file_id, owner)
        stats = self.stats(row, spec.sheet)
        with (
            self._local(file_id) as path,
            open_sheet(path, row.filename, sheet=spec.sheet) as opened,
        ):
            check_output_columns(spec.output_columns, opened.columns, spec.keep_reasoning)
            template = RowTemplate(spec, opened.columns, self.image_cells(spec))
            tokens = estimate_sheet_tokens(template, stats.rows, stats.chars)
            preview = SheetPreview([], stats.rows, tokens)
            for number, cells in opened.rows:
                try:
                    body = template.body(cells)
                except ImageCellError as exc:
                    raise invalid(f"Row {number}: {exc}.", param="template") from None
                messages: Any = body["messages"]
                preview.requests.append(RequestPreview(number, messages, body))
                preview.images = preview.images or any(
                    isinstance(m["content"], list) for m in messages
                )
                if len(preview.requests) >= PREVIEW_REQUESTS:
                    break
        # The tokenizer counts text: a preview with images keeps the text's estimate.
        if count is not None and preview.requests and not preview.images:
            try:
                counted = [count(r.body) for r in preview.requests]
            except APIError:  # a request the model would refuse: characters it is
                counted = [None]
            guessed = sum(
                estimate_tokens("".join(content_text(m["content"]) for m in r.messages))
                for r in preview.requests
            )
            if guessed and all(n is not None for n in counted):
                ratio = sum(n for n in counted if n is not None) / guessed
                preview.tokens = round(tokens * ratio)
                preview.counted_by = spec.model
        return preview

    def image_cells(self, spec: SheetSpec) -> ImageCells:
        """How the spec's image cells become URLs: paths in its folder (if it has one), at
        most --max-image-bytes each."""
        folder = Path(spec.folder) if spec.folder else None
        return ImageCells(folder, self.settings.max_image_bytes)

    def stats(self, sheet_file: File, sheet: str | None) -> SheetStats:
        """The sheet's rows and column sizes (a limit broken on the way is refused here)."""
        key = (sheet_file.id, sheet)
        if key in self._stats:
            return self._stats[key]
        with (
            self._local(sheet_file.id) as path,
            open_sheet(
                path,
                sheet_file.filename,
                sheet=sheet,
                max_rows=self.settings.max_requests_per_batch,
            ) as opened,
        ):
            stats = SheetStats(0, dict.fromkeys(opened.columns, 0))
            sizes = [0] * len(opened.columns)
            for _, cells in opened.rows:
                stats.rows += 1
                for i, cell in enumerate(cells):
                    sizes[i] += len(cell)
            stats.chars = dict(zip(opened.columns, sizes, strict=True))
        while len(self._stats) >= STATS_KEPT:
            self._stats.pop(next(iter(self._stats)), None)
        self._stats[key] = stats
        return stats

    # -- start --------------------------------------------------------------------------

    def start(self, owner: str, file_id: str, spec: SheetSpec) -> Batch:
        """Write the sheet's input file and create its batch; refused (nothing made) when
        the template names a missing column or a row breaks a limit."""
        sheet_file = self._sheet_file(file_id, owner)
        if spec.model.strip() == "":
            raise invalid("Choose the model that answers the rows.", param="model")
        with ExitStack() as stack:
            path = stack.enter_context(self._local(file_id))
            opened = stack.enter_context(
                open_sheet(
                    path,
                    sheet_file.filename,
                    sheet=spec.sheet,
                    max_rows=self.settings.max_requests_per_batch,
                )
            )
            check_output_columns(spec.output_columns, opened.columns, spec.keep_reasoning)
            template = RowTemplate(spec, opened.columns, self.image_cells(spec))
            spec.sheet = opened.sheet_name
            stored = self.files.store_chunks(
                request_lines(template, opened.rows),
                filename=Path(sheet_file.filename).stem + ".jsonl",
                purpose="batch",
                owner=owner,
                empty=SheetError("The sheet has no rows of data under its header."),
            )
        batch = self.batches.create(
            owner,
            stored.id,
            ENDPOINT,
            "24h",
            metadata={SHEET_METADATA_KEY: sheet_file.filename[:512]},
        )
        with self.db.write() as s:
            s.add(
                SheetBatch(
                    batch_id=batch.id,
                    owner=owner,
                    sheet_file_id=sheet_file.id,
                    filename=sheet_file.filename,
                    spec_json=spec.to_json(),
                )
            )
        return batch

    # -- the results as a sheet -------------------------------------------------------

    def sheet_of(self, batch_id: str, owner: str) -> SheetBatch | None:
        """The sheet a batch was made from, or None for a batch made some other way."""
        with self.db.read() as s:
            row = s.get(SheetBatch, batch_id)
        return row if row is not None and row.owner == owner else None

    def export(self, batch_id: str, owner: str, fmt: str, dest: BinaryIO) -> str:
        """Write the finished batch's sheet (`fmt` csv or xlsx) to `dest`: every row in its
        order with the answer's columns (and the thought's, if the spec keeps it), the error,
        finish_reason and token counts. Returns the file name to give it."""
        if fmt not in FORMATS:
            raise invalid(
                f"Invalid format '{fmt}'. Expected one of: {', '.join(FORMATS)}.", param="format"
            )
        batch = self.batches.get(batch_id, owner)
        sheet = self.sheet_of(batch_id, owner)
        if sheet is None:
            raise APIError(
                404, f"The batch '{batch_id}' was not made from a sheet.", code="not_a_sheet_batch"
            )
        if batch.status not in BatchStatus.FINISHED:
            raise invalid(
                f"The batch '{batch_id}' is {batch.status}; its sheet is ready once it ends.",
                param="batch_id",
            )
        if not self.storage.exists(sheet.sheet_file_id):
            raise APIError(
                404,
                f"The sheet '{sheet.filename}' ({sheet.sheet_file_id}) was deleted, so the "
                "results have no rows to join with; download the output file instead.",
                code="file_not_found",
            )
        spec = SheetSpec.from_json(sheet.spec_json)
        with ExitStack() as stack:
            output = self._lines(stack, batch.output_file_id)
            errors = self._lines(stack, batch.error_file_id)
            path = stack.enter_context(self._local(sheet.sheet_file_id))
            opened = stack.enter_context(open_sheet(path, sheet.filename, sheet=spec.sheet))
            header = [*opened.columns, *added_columns(spec.output_columns, spec.keep_reasoning)]
            rows = joined_rows(
                opened.rows, output, errors, spec.output_columns, spec.keep_reasoning
            )
            if fmt == "csv":
                write_csv(dest, header, rows)
            else:
                write_xlsx(dest, header, rows, opened.sheet_name or Path(sheet.filename).stem)
        return f"{Path(sheet.filename).stem}.{batch_id}.{fmt}"

    def _lines(self, stack: ExitStack, file_id: str | None) -> Iterator[bytes]:
        if not file_id or not self.storage.exists(file_id):
            return iter(())
        return iter(stack.enter_context(self.storage.open_file(file_id)))
