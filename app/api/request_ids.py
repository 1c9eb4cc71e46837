"""Request ids: every response carries `x-request-id`, the id its log line and any 500 name.

Like OpenAI, the server makes its own id (`req_` and 32 hex digits) for every request,
whether it reached a route, was refused by the auth middleware or matched nothing. An
incoming `X-Request-Id` is not taken over (a client could otherwise make two requests share
an id in the log); a client's own `X-Client-Request-Id`, OpenAI's header for that, is
written next to it in the log line instead.

The id is made on first use and kept in the ASGI scope's per-request `state`, so the
exception handlers, the request log line and the `before_send` hook that adds the header all
see the same one.
"""

from __future__ import annotations

import uuid

from litestar.enums import ScopeType
from litestar.types import Message, Scope

SCOPE_KEY = "batchyard_request_id"
HEADER = b"x-request-id"


def request_id(scope: Scope) -> str:
    """The request's id, made the first time it is asked for."""
    state = scope["state"]
    found = state.get(SCOPE_KEY)
    if found is None:
        found = state[SCOPE_KEY] = "req_" + uuid.uuid4().hex
    return str(found)


def client_request_id(scope: Scope) -> str | None:
    """The `X-Client-Request-Id` the client sent, if any (at most 512 characters are kept)."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"x-client-request-id":
            return value.decode("latin-1")[:512]
    return None


async def add_request_id(message: Message, scope: Scope) -> None:
    """A before_send hook: put `x-request-id` on every HTTP response."""
    if scope["type"] != ScopeType.HTTP or message["type"] != "http.response.start":
        return
    headers = [h for h in message.get("headers", []) if h[0].lower() != HEADER]
    message["headers"] = [*headers, (HEADER, request_id(scope).encode())]


BEFORE_SEND = [add_request_id]
