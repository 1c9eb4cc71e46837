"""What every controller needs: the services, the caller's owner id, parsed parameters."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from litestar import Request

from app.errors import APIError, invalid

if TYPE_CHECKING:
    from app.batches.runner import Runner
    from app.batches.service import BatchService
    from app.config import Settings
    from app.db import Database
    from app.engine.base import Engine
    from app.files import FileService
    from app.storage import Storage


@dataclass
class Services:
    settings: Settings
    db: Database
    storage: Storage
    files: FileService
    batches: BatchService
    runner: Runner
    engine: Engine


def services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


def owner(request: Request) -> str:
    """The owner id of the caller: set by the auth middleware when API keys are on."""
    return str(request.scope.get("batchyard_owner", ""))  # type: ignore[call-overload]


def query_int(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid(
            f"'{name}' must be an integer between {lo} and {hi}; got '{raw}'.", param=name
        ) from None
    if not lo <= value <= hi:
        raise invalid(f"'{name}' must be between {lo} and {hi}; got {value}.", param=name)
    return value


async def json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, or a clear 400."""
    raw = await request.body()
    if not raw.strip():
        raise APIError(400, "The request body is empty; send a JSON object.", code="invalid_json")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise APIError(400, "The request body is not valid JSON.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_json")
    return data


def page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's cursor page."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
