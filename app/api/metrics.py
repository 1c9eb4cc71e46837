"""GET /metrics (Prometheus text format), and the timing and log line of every HTTP request.

`create_app` adds `HANDLERS` to its route handlers, `MIDDLEWARE` to its middleware and
`BEFORE_SEND` to its before_send hooks. The middleware times each request that matched a
route, labelled by the route's template so ids never explode the label set; the
before_send hook counts and logs the requests that matched none (404, 405).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from litestar import Litestar, Request, get
from litestar.di import NamedDependency
from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.response import Response
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from app.api.request_ids import client_request_id, request_id
from app.services import Services
from app.telemetry import RequestMetrics, render

log = logging.getLogger("batchyard.http")

#: Paths polled by machines (probes, scrapers): their lines are logged at debug level.
QUIET_PATHS = ("/health", "/metrics")
UNMATCHED = "(unmatched)"
_STATE_KEY = "request_metrics"
_SCOPE_TIMED = "batchyard_timed"
_lock = threading.Lock()


def request_metrics(app: Litestar) -> RequestMetrics:
    """The app's own request figures, made on first use."""
    with _lock:
        found = app.state.get(_STATE_KEY)
        if found is None:
            found = app.state[_STATE_KEY] = RequestMetrics()
        return found


def _log_request(scope: Scope, status: int, seconds: float) -> None:
    """One line per request; `request_id` is the response's x-request-id."""
    path = str(scope.get("path", ""))
    level = logging.DEBUG if path in QUIET_PATHS else logging.INFO
    client_id = client_request_id(scope)
    log.log(
        level,
        "method=%s path=%s status=%d ms=%.1f request_id=%s%s",
        scope.get("method", ""),
        path,
        status,
        seconds * 1000,
        request_id(scope),
        f" client_request_id={client_id!r}" if client_id else "",
    )


class RequestTiming(ASGIMiddleware):
    """Times a routed request from its start to the last byte of its response."""

    scopes = (ScopeType.HTTP,)

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        started = time.perf_counter()
        status = 500  # what the client sees if the app fails before it starts a response
        scope["state"][_SCOPE_TIMED] = True

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await next_app(scope, receive, timed_send)
        finally:
            seconds = time.perf_counter() - started
            route = str(scope.get("path_template") or scope.get("path", ""))
            method = str(scope.get("method", ""))
            request_metrics(scope["litestar_app"]).observe(method, route, status, seconds)
            _log_request(scope, status, seconds)


async def count_unmatched(message: Message, scope: Scope) -> None:
    """A before_send hook: the requests no route matched never reach the middleware."""
    if scope["type"] != ScopeType.HTTP or message["type"] != "http.response.start":
        return
    if scope["state"].get(_SCOPE_TIMED):
        return
    method = str(scope.get("method", ""))
    status = int(message["status"])
    # No start time is known here; such answers are immediate, so they count as zero.
    request_metrics(scope["litestar_app"]).observe(method, UNMATCHED, status, 0.0)
    _log_request(scope, status, 0.0)


@get("/metrics", include_in_schema=False, sync_to_thread=True)
def metrics(request: Request[Any, Any, Any], services: NamedDependency[Services]) -> Response[str]:
    """Prometheus text: HTTP timings, batch and line counts, engine figures."""
    body = render(
        db=services.db,
        engine=services.engine,
        requests=request_metrics(request.app),
        engine_failure=services.engine_failure,
        node=services.runner.worker_id,
        in_flight=services.runner.held,
        projections=services.runner.projections,
    )
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


HANDLERS = [metrics]
MIDDLEWARE = [RequestTiming()]
BEFORE_SEND = [count_unmatched]
