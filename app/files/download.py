"""A file's content as an HTTP download: the one answer of `GET /v1/files/{id}/content` and
of the dashboard's download link.

The two used to build their own response and had drifted: the API sent
`application/octet-stream`, the dashboard `application/jsonl` for a `.jsonl` name. OpenAI's
API answers file content as `application/octet-stream` whatever the file holds, and a
client that reads a batch's output from either place gets the same bytes under the same
headers, so the choice is made once, here.
"""

from __future__ import annotations

from litestar.response import File as FileResponse

from app.files.service import FileService

#: The media type of every file's content, as OpenAI's API sends it.
CONTENT_MEDIA_TYPE = "application/octet-stream"


def file_download(files: FileService, owner: str, file_id: str) -> FileResponse:
    """The owner's file `file_id` as an attachment under its own name (404 if not theirs)."""
    row, path = files.content_path(file_id, owner)
    return FileResponse(
        path=path,
        filename=row.filename,
        media_type=CONTENT_MEDIA_TYPE,
        content_disposition_type="attachment",
    )
