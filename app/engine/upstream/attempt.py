"""One try of one upstream request over HTTP, and what its failure means.

A `UpstreamJob` is a request in the upstream engine's queue (engine.py). `attempt` sends it once:
an answer in one piece through the lean keep-alive pool (http1.py), a stream through
aiohttp with each chunk handed on as it arrives. The upstream's kind (kinds/) says where it
goes and reads what comes back. It returns the answer's body, or raises:

- `Retry` for what is worth trying again: connection errors, timeouts and the statuses of
  RETRY_STATUSES. `throttle` marks "too busy now" (the window shrinks), `retry_after` the
  server's own wait, and `down` a server that could not be reached or said it is
  unavailable: if the tries run out on that, the engine is down, not the request bad.
- `EngineError` for the upstream's own 4xx, or an error it sent mid-stream: the request's
  error, with its status and error body (as its kind reads them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from app.config.upstreams import UpstreamSpec
from app.engine.base import ChunkCallback, EngineError
from app.engine.upstream.http1 import ConnectError, Http1Pool, ResponseError
from app.engine.upstream.kinds import UpstreamKind

#: Statuses that mean "too busy now": the window shrinks and the request waits its turn again.
THROTTLE_STATUSES = frozenset({429, 503})
#: Statuses tried again with backoff (besides connection errors and timeouts).
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Statuses that, when they outlast the retries, mean the server (or the proxy in front of
#: it) is down rather than that the request is bad.
DOWN_STATUSES = frozenset({502, 503, 504})


@dataclass(order=True)
class UpstreamJob:
    priority: int
    seq: int
    endpoint: str = field(compare=False)
    payload: bytes = field(compare=False)  # the request body as JSON, encoded once
    stream: bool = field(compare=False)
    on_chunk: ChunkCallback | None = field(compare=False, default=None)
    future: Future[dict[str, Any]] = field(compare=False, default_factory=Future)
    task: asyncio.Task[None] | None = field(compare=False, default=None)
    attempts: int = field(compare=False, default=0)
    started: float = field(compare=False, default=0.0)
    emitted: bool = field(compare=False, default=False)  # a chunk went out: no retry
    backoff: asyncio.TimerHandle | None = field(compare=False, default=None)  # its next try

    __hash__ = object.__hash__  # one job is one request: the running set holds it by identity


class Retry(Exception):
    """One attempt failed in a way worth trying again; `error` is what the caller gets if
    the tries run out."""

    def __init__(
        self,
        error: EngineError,
        *,
        throttle: bool = False,
        retry_after: float | None = None,
        down: bool = False,
    ) -> None:
        super().__init__(error.message)
        self.error = error
        self.throttle = throttle
        self.retry_after = retry_after
        #: The server could not be reached or said it is unavailable: if the retries run
        #: out on this, the engine is down (EngineUnavailable), not the request bad.
        self.down = down


async def attempt(
    job: UpstreamJob,
    spec: UpstreamSpec,
    kind: UpstreamKind,
    client: aiohttp.ClientSession,
    pool: Http1Pool,
) -> dict[str, Any]:
    """Send `job` once to `spec`'s server, which speaks `kind`; its answer's body (see the
    module's docstring)."""
    try:
        if job.stream:
            return await _stream(job, spec, kind, client)
        answer = await pool.post(kind.path(job.endpoint), job.payload)
        if answer.status != 200:
            raise http_error(kind, answer.status, answer.body, answer.headers, spec.name)
        return kind.answer(job.endpoint, answer.body)
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectError, ResponseError) as exc:
        # refused, reset, timed out: the upstream's trouble
        raise Retry(
            EngineError(
                f"The upstream engine '{spec.name}' could not be reached at {spec.url} "
                f"(tried {job.attempts + 1} times): {type(exc).__name__}: {exc}",
                status_code=502,
                code="upstream_unavailable",
                type="server_error",
            ),
            # No connection at all (refused, no DNS name, connect timed out): down. A
            # connection broken mid-answer may be this request's doing: its own error.
            down=isinstance(
                exc,
                (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError, ConnectError),
            ),
        ) from exc


async def _stream(
    job: UpstreamJob, spec: UpstreamSpec, kind: UpstreamKind, client: aiohttp.ClientSession
) -> dict[str, Any]:
    reader = kind.stream(job.endpoint, spec.name)
    async with client.post(spec.root + kind.path(job.endpoint), data=job.payload) as r:
        if r.status != 200:
            raise http_error(kind, r.status, await r.read(), r.headers, spec.name)
        async for raw in r.content:
            for chunk in reader.read(raw):  # an error the upstream sent mid-stream raises
                job.emitted = True
                if job.on_chunk is not None and not job.future.done():
                    job.on_chunk(chunk)
            if reader.done:
                break
    return reader.body()


def http_error(
    kind: UpstreamKind, status: int, content: bytes, headers: Mapping[str, str], engine: str
) -> EngineError | Retry:
    """What an answer other than 200 means: a Retry, or the request's own error."""
    error = kind.error(status, content, engine)
    if status in RETRY_STATUSES:
        return Retry(
            error,
            throttle=status in THROTTLE_STATUSES,
            retry_after=kind.retry_after(headers),
            down=status in DOWN_STATUSES,
        )
    return error


__all__ = [
    "DOWN_STATUSES",
    "RETRY_STATUSES",
    "THROTTLE_STATUSES",
    "Retry",
    "UpstreamJob",
    "attempt",
]
