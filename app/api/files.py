"""/v1/files: upload, list, retrieve, delete, content."""

from __future__ import annotations

from typing import Any

from litestar import Request, delete, get, post
from litestar.params import FromPath
from litestar.response import File as FileResponse

from app.api.common import owner, page, query_int, services
from app.api.upload import receive_upload
from app.files import file_to_openai


@post("/v1/files", request_max_body_size=None, status_code=200)
async def create_file(request: Request) -> dict[str, Any]:
    svc = services(request)
    row = await receive_upload(request, svc.files, owner(request))
    return file_to_openai(row)


@get("/v1/files", sync_to_thread=True)
def list_files(request: Request) -> dict[str, Any]:
    svc = services(request)
    rows, has_more = svc.files.list(
        owner(request),
        purpose=request.query_params.get("purpose") or None,
        limit=query_int(request, "limit", 10000, 1, 10000),
        after=request.query_params.get("after") or None,
        order=request.query_params.get("order") or "desc",
    )
    return page([file_to_openai(r) for r in rows], has_more)


@get("/v1/files/{file_id:str}", sync_to_thread=True)
def retrieve_file(request: Request, file_id: FromPath[str]) -> dict[str, Any]:
    return file_to_openai(services(request).files.get(file_id, owner(request)))


@delete("/v1/files/{file_id:str}", status_code=200, sync_to_thread=True)
def delete_file(request: Request, file_id: FromPath[str]) -> dict[str, Any]:
    services(request).files.delete(file_id, owner(request))
    return {"id": file_id, "object": "file", "deleted": True}


@get("/v1/files/{file_id:str}/content", sync_to_thread=True)
def file_content(request: Request, file_id: FromPath[str]) -> FileResponse:
    row, path = services(request).files.content_path(file_id, owner(request))
    return FileResponse(
        path=path,
        filename=row.filename,
        media_type="application/octet-stream",
        content_disposition_type="attachment",
    )


ROUTES = [create_file, list_files, retrieve_file, delete_file, file_content]
