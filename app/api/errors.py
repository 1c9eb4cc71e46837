"""Exception handlers: every error leaves the server OpenAI-shaped."""

from __future__ import annotations

import logging
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException

from app.errors import APIError, error_body

log = logging.getLogger("batchyard.api")


def _respond(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Response[Any]:
    return Response(
        content=body, status_code=status, media_type="application/json", headers=headers
    )


def api_error(_: Request, exc: APIError) -> Response[Any]:
    headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
    return _respond(exc.status_code, exc.to_body(), headers)


def http_error(request: Request, exc: HTTPException) -> Response[Any]:
    status = exc.status_code
    if isinstance(exc, ValidationException):
        detail = exc.detail or "Invalid request."
        extra = exc.extra if isinstance(exc.extra, list) else []
        param = extra[0].get("key") if extra and isinstance(extra[0], dict) else None
        return _respond(400, error_body(str(detail), type="invalid_request_error", param=param))
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


def server_error(request: Request, exc: Exception) -> Response[Any]:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _respond(
        500,
        error_body("The server had an error while processing your request.", type="server_error"),
    )


EXCEPTION_HANDLERS: dict[Any, Any] = {
    APIError: api_error,
    HTTPException: http_error,
    Exception: server_error,
}
