"""A lean HTTP/1.1 client for an upstream's answered-in-one-piece requests.

Batch lines are short POSTs with JSON answers, thousands a second on one node: the client's
own CPU per request sets how many a node can feed. aiohttp spent about 0.2 ms of CPU on each
(bench/fleet.py, 2 cores); this pool of keep-alive connections writes each request in one
piece and reads the answer with httptools' C parser, with no per-request machinery beside
it. Streamed requests and the /v1/models probe stay on aiohttp (engine.py).

Errors: `ConnectError` when no connection could be made (refused, no such host, the connect
timed out): the server is down. `ResponseError` when the connection broke or the answer
could not be read, `asyncio.TimeoutError` when it took longer than the read timeout: the
request's trouble. A connection the server closed while it sat idle is replaced once,
before any byte of the answer, without counting as a try.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from typing import cast
from urllib.parse import urlsplit

import httptools


class ConnectError(OSError):
    """No connection to the upstream could be made."""


class ResponseError(OSError):
    """The connection broke, or the upstream's answer was not valid HTTP."""


class Answer:
    """One HTTP answer: its status, headers (lower-case names) and whole body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False  # it answered a request before (a stale one may have closed)
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Answer] | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._got_bytes = False
        self._until_close = False  # its answer has no length: it ends when the server closes

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ResponseError(f"the upstream's answer is not valid HTTP: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if exc is None and self._until_close:  # an answer without a length ends here
            status = self._parser.get_status_code()
            waiter.set_result(Answer(status, self._headers, b"".join(self._body)))
            return
        reason = f": {exc}" if exc else ""
        self._fail(ResponseError(f"the upstream closed the connection{reason}"))

    # -- httptools callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        framed = "content-length" in self._headers or "transfer-encoding" in self._headers
        self._until_close = not framed

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter = self._waiter
        answer = Answer(self._parser.get_status_code(), self._headers, b"".join(self._body))
        if not self._parser.should_keep_alive():
            self.close()
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    # -- use

    def send(self, request: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None
        self._headers, self._body, self._got_bytes = {}, [], False
        self._until_close = False
        self._waiter = self.loop.create_future()
        self.transport.write(request)
        return self._waiter

    @property
    def answered_nothing(self) -> bool:
        return not self._got_bytes

    def _fail(self, exc: Exception) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Http1Pool:
    """Keep-alive HTTP/1.1 connections to one server; the engine's window bounds how many
    requests (so connections) are open at once."""

    def __init__(
        self,
        root: str,
        headers: dict[str, str],
        *,
        connect_timeout: float,
        read_timeout: float,
    ) -> None:
        parts = urlsplit(root)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        host = parts.netloc
        lines = [f"Host: {host}", "Connection: keep-alive", "Accept-Encoding: identity"]
        lines += [f"{k}: {v}" for k, v in headers.items() if k.lower() != "host"]
        self._head = "\r\n".join(lines).encode("latin-1")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: collections.deque[_Connection] = collections.deque()

    async def post(self, path: str, body: bytes) -> Answer:
        """POST `body` (JSON) to `path`; the whole answer, whatever its status."""
        request = b"".join(
            (
                f"POST {self.prefix}{path} HTTP/1.1\r\n".encode("latin-1"),
                self._head,
                f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode(
                    "latin-1"
                ),
                body,
            )
        )
        for _ in range(2):
            conn = await self._acquire()
            try:
                answer = await self._exchange(conn, request)
            except ResponseError:
                conn.close()
                if conn.reused and conn.answered_nothing:
                    continue  # closed while idle: once more on a new connection
                raise
            except BaseException:  # timed out or cancelled: the connection goes with it
                conn.close()
                raise
            self._release(conn)
            return answer
        raise ResponseError("the upstream closed two connections before answering")

    async def _exchange(self, conn: _Connection, request: bytes) -> Answer:
        waiter = conn.send(request)
        loop = conn.loop
        timer = loop.call_later(self.read_timeout, _time_out, waiter, self.read_timeout)
        try:
            return await waiter
        finally:
            timer.cancel()

    async def _acquire(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(loop), self.host, self.port, ssl=self.ssl
                ),
                self.connect_timeout,
            )
        except asyncio.TimeoutError as exc:
            raise ConnectError(
                f"connecting to {self.host}:{self.port} took over {self.connect_timeout:g} s"
            ) from exc
        except OSError as exc:  # refused, unreachable, no such host
            raise ConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return conn

    def _release(self, conn: _Connection) -> None:
        if not conn.closed:
            self._idle.append(conn)

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


def _time_out(waiter: asyncio.Future[Answer], seconds: float) -> None:
    if not waiter.done():
        waiter.set_exception(asyncio.TimeoutError(f"no answer within {seconds:g} s"))


__all__ = ["Answer", "ConnectError", "Http1Pool", "ResponseError"]
