"""Who is calling, and whose files and batches they may see.

An ASGI middleware in front of every route. With no keys configured everyone is the one
local owner ("") and the server listens on 127.0.0.1 unless told otherwise. With keys,
`/v1` needs `Authorization: Bearer <key>`, and each key is its own owner: a stable id
derived from the key is put in the request's state (`OWNER_KEY`), which the services filter by
(handlers get it as their `owner` dependency, from `request_owner`). The dashboard gets
the same owner from a signed session cookie (`app.auth.sessions.Sessions`) set by `/login`.

Unsafe methods coming from another site (a foreign Origin or Referer) are refused on
every route: a page on the internet must not be able to post to a server on localhost.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import quote, urlsplit

from litestar import Request
from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from app.auth.keys import Keys, mask
from app.auth.sessions import SESSION_COOKIE, Sessions
from app.errors import error_body

log = logging.getLogger("batchyard.auth")

#: Where the caller's owner id lives in the ASGI scope's per-request `state`.
OWNER_KEY = "batchyard_owner"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
#: Paths the dashboard serves without a session: the login page itself, assets, health.
PUBLIC_PREFIXES = ("/login", "/logout", "/static/", "/health", "/favicon.ico")


def request_owner(request: Request[Any, Any, Any]) -> str:
    """The owner id of the caller (the `owner` dependency): "" when keys are off."""
    return str(request.scope["state"].get(OWNER_KEY, ""))


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _cookie(headers: dict[str, str], name: str) -> str | None:
    for part in headers.get("cookie", "").split(";"):
        k, _, v = part.strip().partition("=")
        if k == name:
            return v
    return None


def same_site(headers: dict[str, str]) -> bool:
    """False when the browser says the request comes from another origin."""
    host = headers.get("host", "")
    origin = headers.get("origin")
    if origin is not None:
        return origin != "null" and urlsplit(origin).netloc == host
    referer = headers.get("referer")
    if referer:
        return urlsplit(referer).netloc == host
    return True  # not a browser (the SDK, curl): nothing to forge


def is_public(path: str) -> bool:
    return any(path == p.rstrip("/") or path.startswith(p) for p in PUBLIC_PREFIXES)


def is_api(path: str) -> bool:
    """Routes that take a Bearer key: the OpenAI surface, and /metrics for scrapers."""
    return path in ("/v1", "/metrics") or path.startswith("/v1/")


class AuthMiddleware:
    """Installed by create_app with the app's one `Keys` and `Sessions` (also on app.state)."""

    def __init__(self, app: ASGIApp, keys: Keys, sessions: Sessions) -> None:
        self.app = app
        self.keys = keys
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        path: str = scope.get("path", "")
        method: str = scope["method"]
        if method not in SAFE_METHODS and not same_site(headers):
            await _json(
                send,
                403,
                "Cross-site request refused: this server accepts changes only from its own "
                "pages and from API clients.",
                "cross_site_request",
            )
            return
        state = scope["state"]
        state[OWNER_KEY] = ""
        if not self.keys.enabled:
            await self.app(scope, receive, send)
            return
        if is_api(path):
            auth = headers.get("authorization", "")
            scheme, _, key = auth.partition(" ")
            key = key.strip()
            if scheme.lower() != "bearer" or not key:
                await _json(
                    send,
                    401,
                    "You didn't provide an API key. You need to provide your API key in an "
                    "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
                    "invalid_api_key",
                )
                return
            owner = self.keys.owner_for(key)
            if owner is None:
                await _json(
                    send,
                    401,
                    f"Incorrect API key provided: {mask(key)}. Ask the administrator of this "
                    "batchyard server for a valid key.",
                    "invalid_api_key",
                )
                return
            state[OWNER_KEY] = owner
            await self.app(scope, receive, send)
            return
        owner = self.sessions.owner_of(_cookie(headers, SESSION_COOKIE))
        # A session of a key that was since removed from the key list ends with it.
        if owner is not None and self.keys.knows(owner):
            state[OWNER_KEY] = owner
            await self.app(scope, receive, send)
            return
        if is_public(path):
            await self.app(scope, receive, send)
            return
        await _login_required(scope, headers, send)


async def _json(send: Send, status: int, message: str, code: str) -> None:
    body = json.dumps(error_body(message, type="invalid_request_error", code=code)).encode()
    extra = [(b"www-authenticate", b"Bearer")] if status == 401 else []
    await _send(send, status, body, [(b"content-type", b"application/json"), *extra])


async def _login_required(scope: Scope, headers: dict[str, str], send: Send) -> None:
    path = scope.get("path", "/")
    query = scope.get("query_string", b"").decode("latin-1")
    target = "/login?next=" + quote(path + ("?" + query if query else ""), safe="")
    if scope.get("method") in SAFE_METHODS and "hx-request" not in headers:
        await _send(send, 303, b"", [(b"location", target.encode())])
        return
    # htmx follows HX-Redirect; anything else gets a plain 401 it can show.
    await _send(
        send,
        401,
        b"Log in first: " + target.encode(),
        [(b"content-type", b"text/plain; charset=utf-8"), (b"hx-redirect", target.encode())],
    )


async def _send(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
