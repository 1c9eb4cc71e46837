"""Streaming multipart uploads: the bytes of `file` go to disk as they arrive.

Litestar's own form parsing holds the whole body in memory; a 200 MB batch file must not,
so `POST /v1/files`, the dashboard's upload and `POST /v1/uploads/{id}/parts` (its `data`
part) read the request stream here and write it through storage's size-capped writer.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio.to_thread
from litestar import Request
from python_multipart.multipart import MultipartParser, parse_options_header

from app.errors import APIError, missing, storage_failed
from app.files.service import FileService, parse_expires_after, too_large
from app.files.storage import PartialWrite, Storage, TooLarge
from app.tables import File

if TYPE_CHECKING:
    # Declared for type checkers only (python_multipart defines it under TYPE_CHECKING).
    from python_multipart.multipart import MultipartCallbacks

#: Small form fields (purpose, expires_after[...]) are kept in memory up to this size.
MAX_FIELD_BYTES = 64 * 1024
#: Disk writes are gathered into pieces this big and done off the event loop.
WRITE_PIECE = 1 << 20


def declared_over(content_length: str | None, limit: int) -> bool:
    """Whether a body's declared Content-Length already puts its file part over `limit`
    bytes (with room for the small fields), so it is refused before a byte is read."""
    return bool(
        content_length
        and content_length.isdigit()
        and int(content_length) > limit + MAX_FIELD_BYTES
    )


@dataclass
class _Part:
    name: str = ""
    filename: str | None = None
    data: bytearray = field(default_factory=bytearray)


class _Collector:
    """Callbacks for python-multipart's streaming parser."""

    def __init__(
        self, file_field: str, begin_write: Callable[[dict[str, str]], PartialWrite]
    ) -> None:
        self.file_field = file_field
        self.begin_write = begin_write
        self.fields: dict[str, str] = {}
        self.partial: PartialWrite | None = None
        self.filename: str | None = None
        self.file_seen = False
        self.pending = bytearray()
        self._part = _Part()
        self._header_field = b""
        self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self.error: APIError | None = None

    # header callbacks
    def on_part_begin(self) -> None:
        self._part = _Part()
        self._headers = {}

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        self._headers[self._header_field.lower()] = self._header_value
        self._header_field = b""
        self._header_value = b""

    def on_headers_finished(self) -> None:
        _, opts = parse_options_header(self._headers.get(b"content-disposition", b""))
        self._part.name = opts.get(b"name", b"").decode("utf-8", "replace")
        raw_name = opts.get(b"filename")
        self._part.filename = raw_name.decode("utf-8", "replace") if raw_name is not None else None
        if self._part.name == self.file_field:
            if self.file_seen:
                raise APIError(
                    400, f"Send exactly one '{self.file_field}' part.", param=self.file_field
                )
            self.file_seen = True
            self.filename = self._part.filename or "upload"
            # Fields sent before the file (the SDK sends `purpose` first) may set its cap.
            self.partial = self.begin_write(self.fields)

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._part.name == self.file_field:
            self.pending += data[start:end]
        else:
            self._part.data += data[start:end]
            if len(self._part.data) > MAX_FIELD_BYTES:
                raise APIError(
                    400, f"Form field '{self._part.name}' is larger than {MAX_FIELD_BYTES} bytes."
                )

    def on_part_end(self) -> None:
        if self._part.name and self._part.name != self.file_field:
            self.fields[self._part.name] = self._part.data.decode("utf-8", "replace")


async def stream_form(
    *,
    content_type: str,
    body: AsyncIterable[bytes],
    file_field: str,
    begin_write: Callable[[dict[str, str]], PartialWrite],
    expected: str,
) -> _Collector:
    """Parse a multipart body as it streams in: the `file_field` part goes to disk through
    the writer `begin_write(fields so far)` gives, small fields stay in memory. A part over
    the writer's limit raises TooLarge; nothing half-written is kept on any error.
    `expected` says what the form holds, for the message about a wrong content type."""
    ctype, params = parse_options_header(content_type)
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        raise APIError(
            400,
            f"{expected} must be sent as multipart/form-data.",
            param=file_field,
            code="invalid_content_type",
        )
    col = _Collector(file_field, begin_write)
    callbacks: MultipartCallbacks = {
        "on_part_begin": col.on_part_begin,
        "on_part_data": col.on_part_data,
        "on_part_end": col.on_part_end,
        "on_header_field": col.on_header_field,
        "on_header_value": col.on_header_value,
        "on_header_end": col.on_header_end,
        "on_headers_finished": col.on_headers_finished,
    }
    parser = MultipartParser(params[b"boundary"], callbacks)

    async def flush(force: bool) -> None:
        if col.partial is not None and col.pending and (force or len(col.pending) >= WRITE_PIECE):
            piece = bytes(col.pending)
            col.pending.clear()
            await anyio.to_thread.run_sync(col.partial.write, piece)

    try:
        async for chunk in body:
            parser.write(chunk)
            await flush(False)
        parser.finalize()
        await flush(True)
    except (TooLarge, APIError):
        if col.partial is not None:
            col.partial.discard()
        raise
    except OSError as exc:  # the disk, not the client: say so, and keep nothing
        if col.partial is not None:
            col.partial.discard()
        raise storage_failed(exc, "the file") from None
    except Exception as exc:
        if col.partial is not None:
            col.partial.discard()
        raise APIError(
            400, f"The multipart body could not be parsed: {exc}", param=file_field
        ) from None
    return col


@dataclass
class Received:
    """A multipart form whose file part is on disk, not yet committed: the caller keeps it
    (`partial.commit`, through a service) or throws it away (`partial.discard`)."""

    partial: PartialWrite
    filename: str
    fields: dict[str, str]


async def receive_file_part(
    request: Request[Any, Any, Any],
    storage: Storage,
    *,
    field: str,
    limit: Callable[[dict[str, str]], int],
    refuse: Callable[[int, dict[str, str]], APIError],
    expected: str,
    ready: Callable[[], object] | None = None,
    upload_part: str | None = None,
) -> Received:
    """Receive a request's multipart body with its one file part (`field`) streamed to disk.

    The one path of `POST /v1/files`, the dashboard's upload and `POST /v1/uploads/{id}/parts`:
    the file part may be at most `limit(fields sent before it)` bytes, and a body whose
    declared Content-Length is already over `limit({})` is refused before a byte is read;
    `refuse(limit, fields)` is the 413 either way. `ready` runs (in a thread) once that
    check passed and before the body is read: the parts' 404 for an upload that is not open.
    `upload_part`, an upload's id, writes a part of it (Storage.begin_part_write).
    A missing file part is a 400 naming `field`; nothing half-written is kept on any error.
    """
    declared = limit({})
    if declared_over(request.headers.get("content-length"), declared):
        raise refuse(declared, {})
    if ready is not None:
        await anyio.to_thread.run_sync(ready)
    before_file: dict[str, str] = {}

    def begin_write(fields: dict[str, str]) -> PartialWrite:
        before_file.update(fields)
        if upload_part is not None:
            return storage.begin_part_write(limit(fields), upload_part)
        return storage.begin_write(limit(fields))

    try:
        form = await stream_form(
            content_type=request.headers.get("content-type", ""),
            body=request.stream(),
            file_field=field,
            begin_write=begin_write,
            expected=expected,
        )
    except TooLarge as exc:
        raise refuse(exc.limit, before_file) from None
    if form.partial is None:
        raise missing(field)
    return Received(form.partial, form.filename or "upload", form.fields)


async def receive_upload(request: Request[Any, Any, Any], files: FileService, owner: str) -> File:
    """Receive and store a file upload (`file`, `purpose`, optional `expires_after[...]`):
    `POST /v1/files` and the dashboard's upload."""
    got = await receive_file_part(
        request,
        files.storage,
        field="file",
        limit=lambda fields: files.limit_for(fields.get("purpose")),
        refuse=lambda limit, fields: too_large(fields.get("purpose"), limit),
        expected="Uploads (a 'file' part and a 'purpose' field)",
    )
    try:
        purpose = files.check_purpose(got.fields.get("purpose"))
        expires_after = None
        if "expires_after[anchor]" in got.fields or "expires_after[seconds]" in got.fields:
            expires_after = parse_expires_after(
                got.fields.get("expires_after[anchor]"), got.fields.get("expires_after[seconds]")
            )
        return await anyio.to_thread.run_sync(
            lambda: files.create(
                partial=got.partial,
                filename=got.filename,
                purpose=purpose,
                owner=owner,
                expires_after=expires_after,
            )
        )
    except OSError as exc:
        got.partial.discard()
        raise storage_failed(exc, "the file") from None
    except BaseException:
        got.partial.discard()
        raise
