"""The lean HTTP/1.1 pool (app/engine/upstream/http1.py) against a real server on a port:
a raw asyncio server that answers as upstreams do (Content-Length, chunked, `Connection:
close`), closes idle connections, or never answers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import pytest

from app.engine.upstream.http1 import ConnectError, Http1Pool, ResponseError
from tests.live import free_port

Handler = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]


async def serve(handler: Handler) -> tuple[asyncio.AbstractServer, str, list[bytes]]:
    """A server that reads each request whole and lets `handler` answer it (it returns
    False to close the connection); every request it read, in order, each after a
    b"CONNECTION" entry for the connection it came on."""
    seen: list[bytes] = []

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(b"CONNECTION")
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                body = await reader.readexactly(length)
                seen.append(head + body)
                if not await handler(head + body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/prefix", seen


def pool(root: str, read_timeout: float = 5.0) -> Http1Pool:
    return Http1Pool(
        root, {"Authorization": "Bearer k"}, connect_timeout=2.0, read_timeout=read_timeout
    )


def run(coro: Awaitable[None]) -> None:
    """Run `coro` on a loop of its own in a thread of its own: an earlier test in the same
    process (Playwright's sync API) may have left a loop running in this one."""
    failed: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(coro)  # type: ignore[arg-type]
        except BaseException as exc:  # handed back to the test's thread
            failed.append(exc)

    t = threading.Thread(target=main)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the test's loop did not finish in 60 s"
    if failed:
        raise failed[0]


def test_answers_by_length_and_chunked_on_one_kept_connection() -> None:
    async def go() -> None:
        async def handler(request: bytes, w: asyncio.StreamWriter) -> bool:
            if b"chunked" in request:
                w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                w.write(b'5\r\n{"a":\r\n3\r\n 1}\r\n0\r\n\r\n')
            else:
                w.write(b"HTTP/1.1 429 Too Many\r\nRetry-After: 3\r\nContent-Length: 2\r\n\r\n{}")
            await w.drain()
            return True

        server, root, seen = await serve(handler)
        p = pool(root)
        a = await p.post("/v1/chat/completions", b'{"x":"chunked"}')
        b = await p.post("/v1/chat/completions", b'{"x":1}')
        assert (a.status, a.body) == (200, b'{"a": 1}')
        assert (b.status, b.headers["retry-after"], b.body) == (429, "3", b"{}")
        assert seen[0] == b"CONNECTION" and len(seen) == 3  # both went over one connection
        assert seen[1].startswith(b"POST /prefix/v1/chat/completions HTTP/1.1\r\n")
        assert b"\r\nAuthorization: Bearer k\r\n" in seen[1]
        assert seen[1].endswith(b'\r\n\r\n{"x":"chunked"}')
        await p.close()
        server.close()

    run(go())


def test_a_connection_closed_while_idle_is_replaced_without_an_error() -> None:
    async def go() -> None:
        async def handler(request: bytes, w: asyncio.StreamWriter) -> bool:
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await w.drain()
            return False  # the server closes every connection after one answer, unannounced

        server, root, seen = await serve(handler)
        p = pool(root)
        for _ in range(3):
            answer = await p.post("/v1/x", b"{}")
            assert answer.body == b"ok"
            await asyncio.sleep(0.05)  # the close reaches the idle connection
        assert seen.count(b"CONNECTION") == 3 and len(seen) == 6  # a new one each time
        await p.close()
        server.close()

    run(go())


def test_connection_close_answers_and_answers_without_a_length() -> None:
    async def go() -> None:
        async def handler(request: bytes, w: asyncio.StreamWriter) -> bool:
            w.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
            await w.drain()
            return False

        server, root, _ = await serve(handler)
        p = pool(root)
        assert (await p.post("/v1/x", b"{}")).body == b"all of it"
        assert (await p.post("/v1/x", b"{}")).body == b"all of it"
        await p.close()
        server.close()

    run(go())


def test_refused_is_a_connect_error_and_silence_a_timeout() -> None:
    async def go() -> None:
        with pytest.raises(ConnectError, match="cannot connect"):
            await pool(f"http://127.0.0.1:{free_port()}").post("/v1/x", b"{}")

        async def silent(request: bytes, w: asyncio.StreamWriter) -> bool:
            await asyncio.sleep(5)
            return False

        server, root, _ = await serve(silent)
        with pytest.raises(asyncio.TimeoutError):
            await pool(root, read_timeout=0.2).post("/v1/x", b"{}")
        server.close()

    run(go())


def test_garbage_and_a_connection_broken_mid_answer_are_response_errors() -> None:
    async def go() -> None:
        async def garbage(request: bytes, w: asyncio.StreamWriter) -> bool:
            w.write(b"SMTP ready\r\n\r\n")
            await w.drain()
            return True

        server, root, _ = await serve(garbage)
        with pytest.raises(ResponseError, match="not valid HTTP"):
            await pool(root).post("/v1/x", b"{}")
        server.close()

        async def half(request: bytes, w: asyncio.StreamWriter) -> bool:
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly some")
            await w.drain()
            return False

        server, root, _ = await serve(half)
        with pytest.raises(ResponseError, match="closed the connection"):
            await pool(root).post("/v1/x", b"{}")
        server.close()

    run(go())
