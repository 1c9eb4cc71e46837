"""Upstream kinds: the table app/config/upstreams.py: KINDS names the module that speaks each
kind's wire, and the engine speaks the wire its spec's kind names. A second kind
(gateway_kind.py) registered in the table for the test drives a real engine against a real
HTTP server that speaks only that wire."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from app.config.upstreams import KINDS, UpstreamSpec, parse_engine_spec
from app.engine.base import Priority
from app.engine.upstream.engine import UpstreamEngine
from app.engine.upstream.kinds import kind_of
from app.engine.upstream.kinds import openai as openai_kind
from app.wire.endpoints import CHAT
from tests.live import free_port

GATEWAY = "tests.unit.engine.upstream.gateway_kind"


@dataclass
class Gateway:
    """A real HTTP server that speaks only the gateway kind's wire; it answers a chat
    request with what its last message said, and remembers each request it got."""

    port: int = field(default_factory=free_port)
    seen: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # http.server's name
                self._note(b"")
                if self.path != "/gw/models":
                    return self._send(404, {"fault": "no such path"})
                self._send(200, {"models": [{"name": "gw-smol", "created_at": 1700000000}]})
                return None

            def do_POST(self) -> None:  # http.server's name
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                self._note(raw)
                if self.path != "/gw/openai/chat/completions" or self.headers["api-key"] != "k":
                    return self._send(404, {"fault": "no such path"})
                wrapped = json.loads(raw)
                said = "echo: " + wrapped["request"]["messages"][-1]["content"]
                if wrapped["request"].get("stream"):
                    return self._events(wrapped["deployment"], said)
                self._send(200, {"result": completion(wrapped["deployment"], said)})
                return None

            def _note(self, raw: bytes) -> None:
                gateway.seen.append((self.command, self.path, dict(self.headers), raw))

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _events(self, model: str, said: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for piece in said.split(" "):
                    delta = {"index": 0, "delta": {"content": piece + " "}, "finish_reason": None}
                    chunk = {"id": "c1", "created": 1, "model": model, "choices": [delta]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/gw"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def completion(model: str, said: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": said}
    return {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    monkeypatch.setitem(KINDS, "gateway", GATEWAY)
    g = Gateway()
    yield g
    g.close()


def test_the_openai_kind_is_the_openai_module() -> None:
    assert KINDS["openai"] == openai_kind.__name__
    assert kind_of(parse_engine_spec("g=openai:http://h/v1")) is openai_kind.KIND


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_in_the_table_loads_a_wire(name: str) -> None:
    kind = kind_of(UpstreamSpec(name="u", url="http://h/v1", kind=name))
    assert kind.models_path.startswith("/")
    for method in ("headers", "path", "encode", "answer", "error", "retry_after", "stream"):
        assert callable(getattr(kind, method)), method


def test_an_engine_speaks_the_wire_its_kind_names(gateway: Gateway) -> None:
    engine = UpstreamEngine(parse_engine_spec(f"gw=gateway:{gateway.url},key=k"))
    engine.start()
    try:
        assert engine.kind == "gateway"
        # Its list of models came from the gateway's own listing, read by its kind.
        assert engine.up and engine.models() == ["gw-smol"]
        assert engine.model_cards() == [
            {"id": "gw-smol", "created": 1700000000, "owned_by": "gateway"}
        ]
        body = {"model": "gw-smol", "messages": [{"role": "user", "content": "hello there"}]}
        answer = engine.submit(CHAT, body, priority=Priority.BATCH).result(30)
        assert answer["choices"][0]["message"]["content"] == "echo: hello there"
        assert answer["usage"]["total_tokens"] == 5
        method, path, headers, raw = gateway.seen[-1]
        assert (method, path) == ("POST", "/gw/openai/chat/completions")
        assert headers["api-key"] == "k" and "Authorization" not in headers
        assert json.loads(raw) == {"deployment": "gw-smol", "request": body}

        chunks: list[dict[str, Any]] = []
        streamed = engine.submit(CHAT, {**body, "stream": True}, on_chunk=chunks.append)
        whole = streamed.result(30)
        assert whole["choices"][0]["message"]["content"] == "echo: hello there "
        assert [c["choices"][0]["delta"]["content"] for c in chunks] == [
            "echo: ",
            "hello ",
            "there ",
        ]
        assert gateway.seen[-1][:2] == ("POST", "/gw/openai/chat/completions")
    finally:
        engine.close()
    assert next((m, p) for m, p, _, _ in gateway.seen if m == "GET") == ("GET", "/gw/models")
