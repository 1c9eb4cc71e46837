"""Images for the image tests, made with Pillow, and a real HTTP server on 127.0.0.1 that
serves them (or a body too big, or one that comes too slowly), counting what it was asked."""

from __future__ import annotations

import base64
import io
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image

from tests.live import free_port

#: Pillow's names of the four formats batchyard takes.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF")


def image_bytes(
    fmt: str, size: tuple[int, int] = (12, 8), color: tuple[int, int, int] = (200, 30, 30)
) -> bytes:
    """A small image in `fmt` (any format Pillow writes); a GIF has two frames."""
    buf = io.BytesIO()
    img = Image.new("RGB", size, color)
    if fmt == "GIF":
        second = Image.new("RGB", size, (0, 0, 250))
        img.save(buf, format="GIF", save_all=True, append_images=[second], duration=100)
    else:
        img.save(buf, format=fmt)
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def decoded(url: str) -> tuple[str, Image.Image]:
    """(the MIME type, the image) of a data URL."""
    head, _, payload = url.partition(",")
    img = Image.open(io.BytesIO(base64.b64decode(payload)))
    img.load()
    return head[len("data:") : -len(";base64")], img


@dataclass
class ImageServer:
    """A real HTTP server on 127.0.0.1. Paths: /NAME serves `files[NAME]`; /big serves
    `big` bytes (with or without a Content-Length: /big?chunked); /slow sends its headers,
    then waits `slow` seconds; /redirect?to=URL answers 302 to URL."""

    files: dict[str, bytes] = field(default_factory=dict)
    big: int = 0
    slow: float = 0.0
    port: int = field(default_factory=free_port)
    asked: Counter[str] = field(default_factory=Counter)
    #: (certificate file, key file): serve HTTPS with them.
    tls: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                server.asked[path] += 1
                if path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", query.removeprefix("to="))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif path == "/big":
                    self.send_response(200)
                    self.send_header("Content-Type", "image/png")
                    if query == "chunked":
                        self.send_header("Connection", "close")
                    else:
                        self.send_header("Content-Length", str(server.big))
                    self.end_headers()
                    sent = 0
                    try:
                        while sent < server.big:
                            self.wfile.write(b"\0" * min(65536, server.big - sent))
                            sent += 65536
                    except OSError:
                        pass
                    self.close_connection = True
                elif path == "/slow":
                    self.send_response(200)
                    self.send_header("Content-Type", "image/png")
                    self.send_header("Content-Length", "100")
                    self.end_headers()
                    self.wfile.flush()
                    time.sleep(server.slow)
                    self.close_connection = True
                elif path.lstrip("/") in server.files:
                    body = server.files[path.lstrip("/")]
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{host}:{self.port}/{path.lstrip('/')}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
