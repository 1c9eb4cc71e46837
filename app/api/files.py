"""/v1/files: upload, list, retrieve, delete, content."""

from __future__ import annotations

from typing import Annotated, Literal

from litestar import Request, delete, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, QueryParameter
from litestar.response import File as FileResponse

from app.api.openapi import MultipartUpload, errors
from app.files.download import CONTENT_MEDIA_TYPE, file_download
from app.files.multipart import receive_upload
from app.files.service import FileService
from app.wire.common import CursorPage, cursor_page
from app.wire.files import FileDeleted, FileObject, file_object


@post(
    "/v1/files",
    operation_id="CreateFile",
    operation_class=MultipartUpload,
    request_max_body_size=None,
    status_code=200,
    responses=errors(413, 507),
)
async def create_file(
    request: Request, files: NamedDependency[FileService], owner: NamedDependency[str]
) -> FileObject:
    """Upload a file (multipart: `file`, `purpose`, optional `expires_after[...]`)."""
    return file_object(await receive_upload(request, files, owner))


@get("/v1/files", operation_id="ListFiles", sync_to_thread=True, responses=errors(404))
def list_files(
    files: NamedDependency[FileService],
    owner: NamedDependency[str],
    *,
    purpose: FromQuery[str | None] = None,
    limit: Annotated[int, QueryParameter(ge=1, le=10000)] = 10000,
    after: FromQuery[str | None] = None,
    order: FromQuery[Literal["asc", "desc"]] = "desc",
) -> CursorPage[FileObject]:
    """List the caller's files, newest first unless `order=asc`."""
    rows, has_more = files.list(
        owner, purpose=purpose or None, limit=limit, after=after or None, order=order
    )
    return cursor_page([file_object(r) for r in rows], has_more)


@get(
    "/v1/files/{file_id:str}",
    operation_id="RetrieveFile",
    sync_to_thread=True,
    responses=errors(404),
)
def retrieve_file(
    files: NamedDependency[FileService], owner: NamedDependency[str], file_id: FromPath[str]
) -> FileObject:
    """One file's metadata."""
    return file_object(files.get(file_id, owner))


@delete(
    "/v1/files/{file_id:str}",
    operation_id="DeleteFile",
    status_code=200,
    sync_to_thread=True,
    responses=errors(404),
)
def delete_file(
    files: NamedDependency[FileService], owner: NamedDependency[str], file_id: FromPath[str]
) -> FileDeleted:
    """Delete a file: gone from the API at once. The bytes of a running batch's input stay
    until that batch ends, so it still finishes every line."""
    files.delete(file_id, owner)
    return FileDeleted(id=file_id, deleted=True)


@get(
    "/v1/files/{file_id:str}/content",
    operation_id="RetrieveFileContent",
    sync_to_thread=True,
    media_type=CONTENT_MEDIA_TYPE,
    responses=errors(404),
)
def file_content(
    files: NamedDependency[FileService], owner: NamedDependency[str], file_id: FromPath[str]
) -> FileResponse:
    """The file's bytes, as uploaded (or as batchyard wrote them, for batch output)."""
    return file_download(files, owner, file_id)


HANDLERS = [create_file, list_files, retrieve_file, delete_file, file_content]
