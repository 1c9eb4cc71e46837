"""The Uploads API's wire: the Upload and UploadPart objects and their parameters."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from msgspec import Struct

from app import tables
from app.wire.common import doc
from app.wire.files import EXPIRES_MAX, EXPIRES_MIN, UPLOAD_PURPOSES, FileObject

UploadStatusName = Literal["pending", "completed", "cancelled", "expired"]
UPLOAD_STATUSES: tuple[UploadStatusName, ...] = get_args(UploadStatusName)


class ExpiresAfter(Struct, kw_only=True):
    anchor: Annotated[str, doc("Only 'created_at': the File's creation.", enum=["created_at"])]
    seconds: Annotated[
        int, doc("From 1 hour to 30 days.", minimum=EXPIRES_MIN, maximum=EXPIRES_MAX)
    ]


class UploadCreateParams(Struct, kw_only=True):
    bytes: Annotated[int, doc("The size of the whole file; the parts must add up to it.")]
    filename: str
    mime_type: Annotated[str, doc("The file's MIME type, e.g. 'application/jsonl'.")]
    purpose: Annotated[
        str,
        doc(
            "What the File is for; 'batch' for a batch input file.",
            enum=list(UPLOAD_PURPOSES),
        ),
    ]
    expires_after: Annotated[
        ExpiresAfter | None, doc("The File's expiry policy (the upload itself expires in an hour).")
    ] = None


class UploadCompleteParams(Struct, kw_only=True):
    part_ids: Annotated[list[str], doc("The parts, in the order their bytes make the file.")]
    md5: Annotated[str | None, doc("The md5 of the whole file, hex; checked if sent.")] = None


class UploadObject(Struct, kw_only=True):
    """`openai.types.Upload`."""

    id: str
    object: Literal["upload"] = "upload"
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: UploadStatusName
    file: FileObject | None = None


class UploadPartObject(Struct, kw_only=True):
    """`openai.types.uploads.UploadPart`."""

    id: str
    object: Literal["upload.part"] = "upload.part"
    created_at: int
    upload_id: str


def upload_part_object(row: tables.UploadPart) -> UploadPartObject:
    return UploadPartObject(id=row.id, created_at=row.created_at, upload_id=row.upload_id)
