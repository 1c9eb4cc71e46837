"""A real HTTP webhook receiver on a free port: it records every request and answers with
the statuses it is given, in order (then 200), as a user's endpoint would."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.waiting import until


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int


@dataclass
class Receiver:
    url: str
    statuses: list[int] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)

    def wait_for(self, count: int, timeout: float = 30) -> list[Received]:
        """The first `count` requests, once they have arrived."""
        until(
            lambda: len(self.received), timeout, f"{count} webhook(s)", accept=lambda n: n >= count
        )
        return self.received[:count]


@contextmanager
def webhook_receiver(statuses: list[int] | None = None) -> Iterator[Receiver]:
    lock = threading.Lock()
    receiver = Receiver(url="", statuses=list(statuses or []))

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # (http.server's name)
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            with lock:
                code = receiver.statuses.pop(0) if receiver.statuses else 200
                receiver.received.append(
                    Received({k.lower(): v for k, v in self.headers.items()}, body, code)
                )
            self.send_response(code)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
