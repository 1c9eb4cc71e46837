"""The Batch API's wire: the Batch object (`BatchObject`), its create parameters, and output lines."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Protocol, get_args

from msgspec import Raw, Struct
from msgspec import json as msgspec_json

from app import tables
from app.wire.common import doc, one_of
from app.wire.endpoints import ENDPOINTS

# -- batches ---------------------------------------------------------------------------------


class OutputExpiresAfter(Struct, kw_only=True):
    anchor: Annotated[
        str, doc("Only 'created_at': the output file's creation.", enum=["created_at"])
    ]
    seconds: Annotated[int, doc("From 1 hour to 30 days.", minimum=3600, maximum=30 * 24 * 3600)]


class BatchCreateParams(Struct, kw_only=True):
    input_file_id: Annotated[str, doc("The id of a file uploaded with purpose 'batch'.")]
    endpoint: Annotated[str, doc(enum=list(ENDPOINTS))]
    completion_window: Annotated[
        str,
        doc(
            "'24h', or another window the server's --completion-windows allows (default "
            "1h, 24h, 7d): a whole number of minutes, hours or days from 1 hour to 7 days."
        ),
    ] = "24h"
    metadata: Annotated[
        dict[str, str] | None,
        doc("At most 16 pairs; keys up to 64 characters, values up to 512.", max_properties=16),
    ] = None
    output_expires_after: OutputExpiresAfter | None = None


class BatchRequestCounts(Struct, kw_only=True):
    completed: int
    failed: int
    total: int


class BatchError(Struct, kw_only=True):
    code: str | None = None
    line: int | None = None
    message: str | None = None
    param: str | None = None


class Errors(Struct, kw_only=True):
    data: list[BatchError] | None = None
    object: str | None = "list"


class BatchInputTokensDetails(Struct, kw_only=True):
    cached_tokens: int


class BatchOutputTokensDetails(Struct, kw_only=True):
    reasoning_tokens: int


class BatchUsage(Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: BatchInputTokensDetails
    output_tokens: int
    output_tokens_details: BatchOutputTokensDetails
    total_tokens: int


BatchStatusName = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
BATCH_STATUSES: tuple[BatchStatusName, ...] = get_args(BatchStatusName)


class BatchObject(Struct, kw_only=True):
    """`openai.types.Batch`, every field present (null where it does not apply yet)."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    errors: Errors | None = None
    input_file_id: str
    completion_window: str
    status: BatchStatusName
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts
    usage: BatchUsage
    metadata: dict[str, str] | None = None


def batch_object(row: tables.Batch) -> BatchObject:
    errors = json.loads(row.errors_json) if row.errors_json else None
    return BatchObject(
        id=row.id,
        endpoint=row.endpoint,
        model=row.model,
        errors=Errors(data=[BatchError(**e) for e in errors]) if errors else None,
        input_file_id=row.input_file_id,
        completion_window=row.completion_window,
        status=one_of(row.status, BATCH_STATUSES),
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        created_at=row.created_at,
        in_progress_at=row.in_progress_at,
        expires_at=row.expires_at,
        finalizing_at=row.finalizing_at,
        completed_at=row.completed_at,
        failed_at=row.failed_at,
        expired_at=row.expired_at,
        cancelling_at=row.cancelling_at,
        cancelled_at=row.cancelled_at,
        request_counts=BatchRequestCounts(
            completed=row.completed, failed=row.failed, total=row.total
        ),
        usage=BatchUsage(
            input_tokens=row.input_tokens,
            input_tokens_details=BatchInputTokensDetails(cached_tokens=row.cached_tokens),
            output_tokens=row.output_tokens,
            output_tokens_details=BatchOutputTokensDetails(reasoning_tokens=row.reasoning_tokens),
            total_tokens=row.input_tokens + row.output_tokens,
        ),
        metadata=json.loads(row.metadata_json) if row.metadata_json else None,
    )


# -- batch output lines ----------------------------------------------------------------------


class BatchResponse(Struct, kw_only=True):
    status_code: int | None
    request_id: str | None
    body: Any


class BatchLineError(Struct, kw_only=True):
    code: str
    message: str


class BatchOutputLine(Struct, kw_only=True):
    """One line of a batch's output or error file (vLLM's `BatchRequestOutput`)."""

    id: str
    custom_id: str
    response: BatchResponse | None
    error: BatchLineError | None


class OutputRow(Protocol):
    """What an output line is made of: a Request row, or just these of its columns."""

    id: str
    custom_id: str
    status: str
    status_code: int | None
    request_id: str | None
    body_json: str | None
    error_json: str | None


def batch_output_line(r: OutputRow) -> BatchOutputLine:
    if r.status == tables.RequestStatus.EXPIRED:
        error = json.loads(r.error_json) if r.error_json else None
        return BatchOutputLine(
            id=r.id,
            custom_id=r.custom_id,
            response=None,
            error=BatchLineError(**error) if error else None,
        )
    return BatchOutputLine(
        id=r.id,
        custom_id=r.custom_id,
        response=BatchResponse(
            status_code=r.status_code,
            request_id=r.request_id,
            # The stored body is JSON already: written as it is, not decoded and encoded again.
            body=Raw(r.body_json) if r.body_json else None,
        ),
        error=None,
    )


def encode_line(line: BatchOutputLine) -> bytes:
    return msgspec_json.encode(line) + b"\n"
