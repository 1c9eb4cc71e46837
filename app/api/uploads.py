"""/v1/uploads: create an upload, add parts (streamed to disk), complete, cancel."""

from __future__ import annotations

import anyio.to_thread
import msgspec
from litestar import Request, post
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from app import tables
from app.api.errors import json_object_body
from app.api.openapi import UploadPartForm, errors
from app.errors import APIError
from app.files.multipart import receive_file_part
from app.files.uploads import UploadService, status_of
from app.wire.common import one_of
from app.wire.files import file_object
from app.wire.uploads import (
    UPLOAD_STATUSES,
    UploadCompleteParams,
    UploadCreateParams,
    UploadObject,
    UploadPartObject,
    upload_part_object,
)


def part_too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"Upload parts may be at most {limit} bytes ({limit / (1024 * 1024):g} MB, the "
        "server's max_upload_part_bytes); this part is larger. Split the file into more parts.",
        param="data",
        code="part_too_large",
    )


def upload_object(row: tables.Upload, file: tables.File | None = None) -> UploadObject:
    return UploadObject(
        id=row.id,
        bytes=row.bytes,
        created_at=row.created_at,
        expires_at=row.expires_at,
        filename=row.filename,
        purpose=row.purpose,
        status=one_of(status_of(row), UPLOAD_STATUSES),
        file=file_object(file) if file is not None else None,
    )


@post(
    "/v1/uploads",
    operation_id="CreateUpload",
    status_code=200,
    before_request=json_object_body,
    responses=errors(),
)
async def create_upload(
    data: JSONBody[UploadCreateParams],
    uploads: NamedDependency[UploadService],
    owner: NamedDependency[str],
) -> UploadObject:
    """Start an upload of `bytes` bytes; add its parts, then complete it."""
    expires = data.expires_after
    row = await anyio.to_thread.run_sync(
        lambda: uploads.create(
            owner,
            filename=data.filename,
            purpose=data.purpose,
            bytes=data.bytes,
            mime_type=data.mime_type,
            expires_after=msgspec.structs.asdict(expires) if expires else None,
        )
    )
    return upload_object(row)


@post(
    "/v1/uploads/{upload_id:str}/parts",
    operation_id="AddUploadPart",
    operation_class=UploadPartForm,
    request_max_body_size=None,
    status_code=200,
    responses=errors(404, 413, 507),
)
async def add_upload_part(
    request: Request,
    uploads: NamedDependency[UploadService],
    owner: NamedDependency[str],
    upload_id: FromPath[str],
) -> UploadPartObject:
    """Add one part (multipart `data`, at most 64 MB); parts may come in any order and at once."""
    limit = uploads.settings.max_upload_part_bytes
    got = await receive_file_part(
        request,
        uploads.storage,
        field="data",
        limit=lambda _: limit,
        refuse=lambda limit, _: part_too_large(limit),
        expected="Upload parts (a 'data' part)",
        ready=lambda: uploads.check_open(upload_id, owner),
        upload_part=upload_id,
    )
    partial = got.partial
    part = await anyio.to_thread.run_sync(lambda: uploads.add_part(upload_id, owner, partial))
    return upload_part_object(part)


@post(
    "/v1/uploads/{upload_id:str}/complete",
    operation_id="CompleteUpload",
    status_code=200,
    before_request=json_object_body,
    responses=errors(404, 507),
)
async def complete_upload(
    data: JSONBody[UploadCompleteParams],
    uploads: NamedDependency[UploadService],
    owner: NamedDependency[str],
    upload_id: FromPath[str],
) -> UploadObject:
    """Join the parts, in the order of `part_ids`, into a File (checked against `md5`)."""
    row, file = await anyio.to_thread.run_sync(
        lambda: uploads.complete(upload_id, owner, data.part_ids, data.md5)
    )
    return upload_object(row, file)


@post(
    "/v1/uploads/{upload_id:str}/cancel",
    operation_id="CancelUpload",
    status_code=200,
    sync_to_thread=True,
    responses=errors(404),
)
def cancel_upload(
    uploads: NamedDependency[UploadService], owner: NamedDependency[str], upload_id: FromPath[str]
) -> UploadObject:
    """Cancel a pending upload; its parts are removed."""
    return upload_object(uploads.cancel(upload_id, owner))


HANDLERS = [create_upload, add_upload_part, complete_upload, cancel_upload]
