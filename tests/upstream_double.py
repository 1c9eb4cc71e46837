"""An overloaded or flaky upstream, for the upstream engine's tests: a real HTTP server on a
free port that answers from a script (429 with Retry-After, 503, 500, a dropped connection)
and then forwards every request to a real OpenAI-compatible server (a `batchyard serve`).

It stands in for an upstream's overload only; the answers it forwards are the real server's.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from openai import OpenAI

from app.config import bundled_model_path
from tests.live import LiveServer, free_port

#: The upstream serves the default model under this name (a link to the GGUF), so an
#: answer's `model` tells which engine wrote it.
UPSTREAM_MODEL = "remote-smol"
#: A name the front sends to the flaky double (configured with models=).
FLAKY_MODEL = "flaky-smol"
#: The front's first wait before it tries the double again (backoff=), doubling each time:
#: shorter than the default 0.5 s, so that a test of retries waits seconds less.
FLAKY_BACKOFF_S = 0.2


def upstream_model_args(folder: Path) -> list[str]:
    """`serve` arguments for a real upstream batchyard: the default model through a link
    named after UPSTREAM_MODEL, made in `folder`."""
    model = folder / f"{UPSTREAM_MODEL}.gguf"
    model.symlink_to(bundled_model_path())
    return ["--model", str(model)]


BUSY = b'{"error": {"message": "busy", "type": "server_error", "param": null, "code": null}}'


@dataclass
class Arrival:
    """One request the double received: when, how many were open then (itself included),
    and what it answered ("forwarded", or the scripted failure)."""

    at: float
    in_flight: int
    answer: str
    body: bytes = b""
    #: It came on a connection that had carried a request before: a "drop" there looks to
    #: the client like a keep-alive connection closed while idle, which it sends again on a
    #: new one at once (engine/upstream/http1.py), not as a retry.
    reused: bool = False


@dataclass
class FlakyUpstream:
    target: str  # the real server's root, e.g. http://127.0.0.1:PORT
    port: int = field(default_factory=free_port)
    #: What the next requests get, one entry each: "429:SECONDS" (Retry-After), "429",
    #: "503:SECONDS", "500", "502", "drop" (close without an answer). Empty: forward.
    script: deque[str] = field(default_factory=deque)
    arrivals: list[Arrival] = field(default_factory=list)
    hold: float = 0.0  # seconds every request waits before its answer (to make overlap visible)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self.served = getattr(self, "served", 0) + 1
                r = httpx.get(double.target + self.path, timeout=30)
                self._answer(r.status_code, r.content, r.headers.get("content-type", ""))

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                reused = getattr(self, "served", 0) > 0  # one handler serves one connection
                self.served = getattr(self, "served", 0) + 1
                with double._lock:
                    double._open += 1
                    step = double.script.popleft() if double.script else "forward"
                    double.arrivals.append(
                        Arrival(time.monotonic(), double._open, step, body, reused)
                    )
                try:
                    answer = self._post(step, body)
                finally:
                    # Closed before the answer goes out, so the next request the client
                    # starts on seeing it never counts this one as still open.
                    with double._lock:
                        double._open -= 1
                if answer is None:
                    self.close_connection = True
                    self.connection.shutdown(2)  # no answer at all: a connection error
                    return
                self._answer(*answer)

            def _post(
                self, step: str, body: bytes
            ) -> tuple[int, bytes, str, dict[str, str]] | None:
                time.sleep(double.hold)
                if step == "drop":
                    return None
                if step != "forward":
                    status, _, after = step.partition(":")
                    headers = {"Retry-After": after} if after else {}
                    return int(status), BUSY, "application/json", headers
                r = httpx.post(
                    double.target + self.path,
                    content=body,
                    headers={"Content-Type": "application/json"},
                    timeout=120,
                )
                return r.status_code, r.content, r.headers.get("content-type", ""), {}

            def _answer(
                self,
                status: int,
                content: bytes,
                kind: str,
                headers: dict[str, str] | None = None,
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind or "application/json")
                self.send_header("Content-Length", str(len(content)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(content)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def plan(self, *steps: str) -> None:
        """Script the next answers, and forget earlier arrivals."""
        with self._lock:
            self.script.clear()
            self.script.extend(steps)
            self.arrivals.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class Fleet:
    """tests/e2e/conftest.py's `fleet`: three servers."""

    upstream: LiveServer  # a real batchyard serving UPSTREAM_MODEL
    double: FlakyUpstream  # forwards to `upstream` after its scripted failures
    front: LiveServer  # batchyard with engines `up` (upstream) and `flaky` (double)


def counting_batch(c: OpenAI, lines: int) -> str:
    """A batch of `lines` short chat lines for UPSTREAM_MODEL (`line-0`...), created through
    the SDK, once its first two lines are done: the upstream is busy with it. Its id."""
    from tests.factories import batch_line
    from tests.http_helpers import sdk_batch, until_lines_completed

    body = [
        batch_line(f"line-{i}", f"Count to {i}.", model=UPSTREAM_MODEL, max_tokens=12)
        for i in range(lines)
    ]
    b = sdk_batch(c, body)
    until_lines_completed(c, b.id, 2)
    return b.id


def assert_every_line_once(c: OpenAI, batch_id: str, lines: int) -> None:
    """The counting batch finishes completed: each of its lines answered 200 once, none failed."""
    from tests.factories import jsonl_lines
    from tests.http_helpers import FINISHED, wait_for_status

    done = wait_for_status(c.batches.retrieve, batch_id, FINISHED, 180, poll=0.3)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (lines, 0)
    assert done.error_file_id is None
    assert done.output_file_id is not None
    out = jsonl_lines(c.files.content(done.output_file_id).text)
    assert sorted(x["custom_id"] for x in out) == sorted(f"line-{i}" for i in range(lines))
    assert all(x["response"]["status_code"] == 200 for x in out)
