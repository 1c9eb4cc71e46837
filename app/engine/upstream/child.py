"""The upstream client process: one `UpstreamEngine` in a process of its own.

A node runs each `--engine` upstream's HTTP client here (process.py starts it), so that the
client's event loop never waits for the node's GIL while the runner claims and records
lines: on two cores, sharing one GIL held the node at about 0.84x the rate of a plain
client (bench/fleet.py). Requests come in on stdin and answers go out on stdout as the
frames of pipe.py; log lines go to stderr, the node's own. The process ignores SIGINT and
SIGTERM: it ends when the node says so, or when its stdin closes because the node is gone.

    python -m app.engine.upstream.child      (the single binary: `batchyard _upstream`)
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import Future
from functools import partial
from typing import Any

from app.config.upstreams import UpstreamSpec
from app.engine.base import EngineError, EngineUnavailable, Priority, RequestCancelled
from app.engine.upstream.engine import UpstreamEngine
from app.engine.upstream.pipe import (
    CANCELLED,
    FAILED,
    READ_SIZE,
    UNAVAILABLE,
    FrameReader,
    frame,
    widen,
    write_all,
)
from app.runtime import jsoncodec

log = logging.getLogger("batchyard.upstream")

#: Seconds between two looks at the upstream's state (sent when it changed).
STATE_INTERVAL = 0.2
STDIN, STDOUT = 0, 1


class Bridge:
    """Frames in -> the engine; its answers -> frames out. Runs on the engine's loop thread,
    except `send` and `flush`, which any thread may call."""

    def __init__(self, engine: UpstreamEngine, fd: int) -> None:
        self.engine = engine
        self.fd = fd
        self._futures: dict[int, Future[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._out: list[bytes] = []
        self._scheduled = False
        self._state: dict[str, Any] | None = None

    def handle(self, messages: list[list[Any]]) -> None:
        for message in messages:
            if message[0] == "s":
                self._submit(*message[1:])
            elif message[0] == "c":
                future = self._futures.get(message[1])
                if future is not None:
                    self.engine.cancel(future)

    def _submit(  # noqa: PLR0917 - its arguments are a submit frame's fields, in order
        self,
        rid: int,
        endpoint: str,
        priority: int,
        stream: bool,
        payload: bytes,
        wants_chunks: bool,
    ) -> None:
        on_chunk = partial(self._chunk, rid) if wants_chunks else None
        try:
            future = self.engine.submit_encoded(
                endpoint, payload, stream=stream, priority=Priority(priority), on_chunk=on_chunk
            )
        except ValueError as exc:
            future = Future()
            future.set_exception(EngineError(str(exc)))
        self._futures[rid] = future
        future.add_done_callback(partial(self._done, rid))

    def _chunk(self, rid: int, chunk: dict[str, Any]) -> None:
        self.send(["k", rid, jsoncodec.dumps_bytes(chunk)])

    def _done(self, rid: int, future: Future[dict[str, Any]]) -> None:
        self._futures.pop(rid, None)
        exc = future.exception()
        if exc is None:
            self.send(["r", rid, jsoncodec.dumps_bytes(future.result())])
            return
        if isinstance(exc, RequestCancelled):
            kind = CANCELLED
        elif isinstance(exc, EngineUnavailable):
            kind = UNAVAILABLE
        else:
            kind = FAILED
        if not isinstance(exc, EngineError):
            exc = EngineError(str(exc), status_code=500, code="server_error", type="server_error")
        self.send(["e", rid, kind, exc.status_code, exc.message, exc.param, exc.code, exc.type])

    def send(self, message: list[Any]) -> None:
        """Queue a frame; the loop writes what is queued once per pass (many at once)."""
        with self._lock:
            self._out.append(frame(message))
            if self._scheduled:
                return
            self._scheduled = True
        self.engine.loop.call_soon_threadsafe(self.flush)

    def flush(self, *, state: bool = False) -> None:
        """Write the queued frames, and the upstream's state if it changed (or `state`)."""
        with self._lock:
            self._scheduled = False
            now = self.state()
            if state or now != self._state:
                self._state = now
                self._out.append(frame(["t", now]))
            data = b"".join(self._out)
            self._out.clear()
            if data:
                write_all(self.fd, data)

    def state(self) -> dict[str, Any]:
        status = self.engine.status()
        return {
            "up": status.up,
            "error": status.last_error,
            "cards": self.engine.model_cards(),
            "window": status.window,
            "retries": status.retries_total,
            "throttled": status.throttled_total,
            "id": self.engine.info.id,
        }

    def watch(self) -> None:
        """Every STATE_INTERVAL: the state, when the upstream's probe changed it."""
        self.flush()
        self.engine.loop.call_later(STATE_INTERVAL, self.watch)


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the node's to handle
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    widen(STDOUT)
    reader = FrameReader()
    pending: list[list[Any]] = []
    while not pending:
        data = os.read(STDIN, READ_SIZE)
        if not data:
            return 0
        pending = reader.feed(data)
    first, pending = pending[0], pending[1:]
    if first[0] != "spec":
        print(f"upstream client: expected the spec first, got {first[0]!r}", file=sys.stderr)
        return 2
    fields, discover_timeout, level = first[1], float(first[2]), int(first[3])
    logging.basicConfig(
        stream=sys.stderr, level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    fields["models"] = tuple(fields.get("models") or ())
    engine = UpstreamEngine(UpstreamSpec(**fields))
    bridge = Bridge(engine, STDOUT)
    engine.start(discover_timeout, quiet=True)
    bridge.flush(state=True)  # the node's start() waits for this first state
    engine.loop.call_soon_threadsafe(engine.loop.call_later, STATE_INTERVAL, bridge.watch)
    quit_ = False
    while True:
        if pending:
            quit_ = any(m[0] == "q" for m in pending)
            engine.loop.call_soon_threadsafe(bridge.handle, pending)
        if quit_:
            break
        data = os.read(STDIN, READ_SIZE)
        if not data:
            break  # the node is gone
        pending = reader.feed(data)
    started = time.monotonic()
    engine.close()  # what is still pending fails with engine_closed: sent before exiting
    bridge.flush()
    log.debug("engine=%s client process closed in %.2fs", engine.name, time.monotonic() - started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
