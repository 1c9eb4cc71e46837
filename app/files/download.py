"""A file's content as an HTTP download: the one answer of `GET /v1/files/{id}/content` and
of the dashboard's download link.

The two used to build their own response and had drifted: the API sent
`application/octet-stream`, the dashboard `application/jsonl` for a `.jsonl` name. OpenAI's
API answers file content as `application/octet-stream` whatever the file holds, and a
client that reads a batch's output from either place gets the same bytes under the same
headers, so the choice is made once, here.
"""

from __future__ import annotations

from typing import IO, TYPE_CHECKING, Any, cast

from litestar.response import File as FileResponse
from litestar.types.file_types import FileInfo, FileSystemProtocol

from app.files.service import FileService
from app.files.storage import Storage

if TYPE_CHECKING:
    from litestar.types.file_types import PathType

#: The media type of every file's content, as OpenAI's API sends it.
CONTENT_MEDIA_TYPE = "application/octet-stream"


def file_download(files: FileService, owner: str, file_id: str) -> FileResponse:
    """The owner's file `file_id` as an attachment under its own name (404 if not theirs).

    A file in the data dir is sent from its path; one in a bucket is streamed from the
    store as it is read (StoredFile), never held whole."""
    row = files.content(file_id, owner)
    local = files.storage.local_path(row.id)
    if local is not None:
        return FileResponse(
            path=local,
            filename=row.filename,
            media_type=CONTENT_MEDIA_TYPE,
            content_disposition_type="attachment",
        )
    info: FileInfo = {
        "name": row.id,
        "size": row.bytes,
        "type": "file",
        "islink": False,
        "mtime": float(row.created_at),
        "created": float(row.created_at),
        "gid": 0,
        "ino": 0,
        "mode": 0o100644,
        "nlink": 1,
        "uid": 0,
    }
    return FileResponse(
        path=row.id,
        filename=row.filename,
        media_type=CONTENT_MEDIA_TYPE,
        content_disposition_type="attachment",
        # The protocol's open has overloads per mode; this one serves only "rb".
        file_system=cast(FileSystemProtocol, StoredFile(files.storage, row.id)),
        file_info=info,
    )


class StoredFile:
    """Litestar's file-system protocol over one stored file: `open` streams its bytes."""

    def __init__(self, storage: Storage, file_id: str) -> None:
        self.storage = storage
        self.file_id = file_id

    def info(self, path: PathType, **kwargs: Any) -> FileInfo:
        raise NotImplementedError("the file's info is given with the response")

    def open(self, file: PathType, mode: str, buffering: int = -1) -> IO[bytes]:  # noqa: ARG002 - Litestar's protocol
        return self.storage.open_file(self.file_id)
