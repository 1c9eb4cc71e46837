"""Exception handlers: every error leaves the server OpenAI-shaped, naming its parameter.

Typed bodies and query parameters are checked by Litestar (msgspec) before a handler runs;
`validation_error` turns its findings into OpenAI's 400s. `json_object_body` runs before
those checks on every handler that takes a JSON body, so an empty, malformed, too deeply
nested or non-object body is one clear `invalid_json` error, never a 500.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from app.api.request_ids import request_id
from app.errors import APIError, error_body, invalid, missing, storage_failed, storage_full

log = logging.getLogger("batchyard.api")

_REQUIRED = re.compile(r"Object missing required field `([^`]+)`")


def _respond(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Response[Any]:
    return Response(
        content=body, status_code=status, media_type="application/json", headers=headers
    )


async def json_object_body(request: Request[Any, Any, Any]) -> None:
    """A before_request hook: the body must be one JSON object (Litestar then keeps the
    decoded value, so it is parsed once)."""
    raw = await request.body()
    if not raw.strip():
        raise APIError(400, "The request body is empty; send a JSON object.", code="invalid_json")
    try:
        data = await request.json()
    except Exception:  # malformed, or nested past the decoder's depth (RecursionError)
        raise APIError(400, "The request body is not valid JSON.", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.", code="invalid_json")


def param_name(key: str) -> str:
    """msgspec's path as batchyard names parameters: `a.b` -> `a[b]`, dict values -> the dict."""
    key = key.replace("[...]", "")
    head, *rest = key.split(".")
    return head + "".join(f"[{part}]" for part in rest)


def _as_api_error(item: dict[str, Any], query: Any) -> APIError:
    message = str(item.get("message") or "Invalid value.")
    key = str(item.get("key") or "")
    if found := _REQUIRED.search(message):
        parent = "" if key in ("", "data") else param_name(key)
        return missing(f"{parent}[{found.group(1)}]" if parent else found.group(1))
    param = None if key in ("", "data") else param_name(key)
    if param is None:
        return APIError(400, "The request body must be a JSON object.", code="invalid_json")
    if message.endswith("got `null`"):
        return missing(param)  # null where a value is required: as good as not sent
    plain = message.replace("`", "")
    sent = query.get(key) if item.get("source") == "query" else None
    got = ""
    if sent is not None and f"'{sent}'" not in plain:
        plain = plain.split(", got ")[0]  # msgspec names the type; the value says more
        got = f"; got '{sent}'"
    return invalid(
        f"Invalid value for '{param}': {plain[:1].lower()}{plain[1:]}{got}.", param=param
    )


def validation_error(request: Request[Any, Any, Any], exc: ValidationException) -> Response[Any]:
    extra = exc.extra if isinstance(exc.extra, list) else []
    items = [e for e in extra if isinstance(e, dict)]
    err = (
        _as_api_error(items[0], request.query_params)
        if items
        else invalid(str(exc.detail), param=None)
    )
    return _respond(err.status_code, err.to_body())


def api_error(_: Request[Any, Any, Any], exc: APIError) -> Response[Any]:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
    return _respond(exc.status_code, exc.to_body(), headers)


def http_error(request: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    status = exc.status_code
    if status == 404:
        message = f"Unknown request URL: {request.method} {request.url.path}."
        return _respond(404, error_body(message, type="invalid_request_error", code="unknown_url"))
    if status == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}."
        return _respond(
            405, error_body(message, type="invalid_request_error", code="method_not_allowed")
        )
    if status == 413:
        return _respond(
            413,
            error_body(
                "The request body is too large.",
                type="invalid_request_error",
                code="request_too_large",
            ),
        )
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return _respond(status, error_body(str(exc.detail), type=kind))


def server_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    rid = request_id(request.scope)
    if storage_full(exc):  # whichever endpoint wrote: a 507 that says so
        log.error("data dir full on %s %s request_id=%s: %s", request.method,
                  request.url.path, rid, exc)  # fmt: skip
        err = storage_failed(exc)
        return _respond(err.status_code, err.to_body())
    log.exception(
        "unhandled error on %s %s request_id=%s",
        request.method,
        request.url.path,
        rid,
        exc_info=exc,
    )
    # OpenAI's wording: the id lets an operator find this request's log lines.
    message = (
        "The server had an error while processing your request. "
        f"(Please include the request ID {rid} when you report it.)"
    )
    return _respond(500, error_body(message, type="server_error"))


EXCEPTION_HANDLERS: dict[Any, Any] = {
    APIError: api_error,
    ValidationException: validation_error,
    HTTPException: http_error,
    Exception: server_error,
}
