"""/v1/batches: create, retrieve, list, cancel."""

from __future__ import annotations

from typing import Annotated

import anyio.to_thread
from litestar import get, post
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from app.api.errors import json_object_body
from app.api.openapi import errors
from app.batches.service import BatchService
from app.wire.batches import BatchCreateParams, BatchObject, batch_object
from app.wire.common import CursorPage, cursor_page


@post(
    "/v1/batches",
    operation_id="CreateBatch",
    status_code=200,
    before_request=json_object_body,
    responses=errors(507),
)
async def create_batch(
    data: JSONBody[BatchCreateParams],
    batches: NamedDependency[BatchService],
    owner: NamedDependency[str],
) -> BatchObject:
    """Create a batch from an uploaded input file; it starts validating at once."""
    batch = await anyio.to_thread.run_sync(
        lambda: batches.create(
            owner,
            input_file_id=data.input_file_id,
            endpoint=data.endpoint,
            completion_window=data.completion_window,
            metadata=data.metadata,
            output_expires_after=data.output_expires_after,
        )
    )
    return batch_object(batch)


@get("/v1/batches", operation_id="ListBatches", sync_to_thread=True, responses=errors(404))
def list_batches(
    batches: NamedDependency[BatchService],
    owner: NamedDependency[str],
    limit: Annotated[int, QueryParameter(ge=1, le=100)] = 20,
    after: FromQuery[str | None] = None,
) -> CursorPage[BatchObject]:
    """List the caller's batches, newest first."""
    rows, has_more = batches.list(owner, limit=limit, after=after or None)
    return cursor_page([batch_object(b) for b in rows], has_more)


@get(
    "/v1/batches/{batch_id:str}",
    operation_id="RetrieveBatch",
    sync_to_thread=True,
    responses=errors(404),
)
def retrieve_batch(
    batches: NamedDependency[BatchService], owner: NamedDependency[str], batch_id: FromPath[str]
) -> BatchObject:
    """One batch, with its live request counts."""
    return batch_object(batches.get(batch_id, owner))


@post(
    "/v1/batches/{batch_id:str}/cancel",
    operation_id="CancelBatch",
    status_code=200,
    sync_to_thread=True,
    responses=errors(404),
)
def cancel_batch(
    batches: NamedDependency[BatchService], owner: NamedDependency[str], batch_id: FromPath[str]
) -> BatchObject:
    """Cancel a validating or running batch; lines already done stay in its output."""
    return batch_object(batches.cancel(batch_id, owner))


HANDLERS = [create_batch, list_batches, retrieve_batch, cancel_batch]
