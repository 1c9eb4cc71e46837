"""/v1/batches: create, retrieve, list, cancel."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from litestar import Request, get, post
from litestar.params import FromPath

from app.api.common import json_object, owner, page, query_int, services


@post("/v1/batches", status_code=200)
async def create_batch(request: Request) -> dict[str, Any]:
    data = await json_object(request)
    svc = services(request)
    batch = await anyio.to_thread.run_sync(
        lambda: svc.batches.create(
            owner(request),
            input_file_id=data.get("input_file_id"),
            endpoint=data.get("endpoint"),
            completion_window=data.get("completion_window"),
            metadata=data.get("metadata"),
            output_expires_after=data.get("output_expires_after"),
        )
    )
    return svc.batches.to_openai(batch)


@get("/v1/batches", sync_to_thread=True)
def list_batches(request: Request) -> dict[str, Any]:
    svc = services(request)
    rows, has_more = svc.batches.list(
        owner(request),
        limit=query_int(request, "limit", 20, 1, 100),
        after=request.query_params.get("after") or None,
    )
    return page([svc.batches.to_openai(b) for b in rows], has_more)


@get("/v1/batches/{batch_id:str}", sync_to_thread=True)
def retrieve_batch(request: Request, batch_id: FromPath[str]) -> dict[str, Any]:
    svc = services(request)
    return svc.batches.to_openai(svc.batches.get(batch_id, owner(request)))


@post("/v1/batches/{batch_id:str}/cancel", status_code=200, sync_to_thread=True)
def cancel_batch(request: Request, batch_id: FromPath[str]) -> dict[str, Any]:
    svc = services(request)
    return svc.batches.to_openai(svc.batches.cancel(batch_id, owner(request)))


ROUTES = [create_batch, list_batches, retrieve_batch, cancel_batch]
