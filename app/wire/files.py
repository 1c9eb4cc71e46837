"""The Files API's wire: FileObject and FileDeleted, named as openai-python names them."""

from __future__ import annotations

from typing import Literal, get_args

from msgspec import Struct

from app import tables
from app.wire.common import one_of

# -- files -----------------------------------------------------------------------------------

FilePurpose = Literal[
    "assistants",
    "assistants_output",
    "batch",
    "batch_output",
    "fine-tune",
    "fine-tune-results",
    "vision",
    "user_data",
    "evals",
]
FILE_PURPOSES: tuple[FilePurpose, ...] = get_args(FilePurpose)


#: Purposes a client may upload with (OpenAI's list); batch_output is written by batchyard.
UPLOAD_PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
#: The range of an `expires_after[seconds]`: an hour to 30 days.
EXPIRES_MIN, EXPIRES_MAX = 3600, 30 * 24 * 3600


class FileObject(Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None


class FileDeleted(Struct, kw_only=True):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


def file_object(row: tables.File) -> FileObject:
    return FileObject(
        id=row.id,
        bytes=row.bytes,
        created_at=row.created_at,
        expires_at=row.expires_at,
        filename=row.filename,
        purpose=one_of(row.purpose, FILE_PURPOSES),
    )
