"""The frames between a node and its upstream client process (process.py, child.py).

Each frame is a 4-byte little-endian length and a msgpack array whose first item says what
it is. Request and answer bodies travel as the JSON bytes they are on the wire, so neither
side decodes what it only passes on.

node -> client process:
    ["spec", {UpstreamSpec fields}, discover_timeout, log_level]   first, once
    ["s", id, endpoint, priority, stream, body_json, wants_chunks] a request
    ["c", id]                                                      cancel it
    ["q"]                                                          close and exit
client process -> node:
    ["r", id, answer_json]                                         the answer
    ["k", id, chunk_json]                                          a stream chunk
    ["e", id, kind, status, message, param, code, type]           its error
    ["t", state]                                                   the upstream's state
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
from typing import Any

import msgspec

_HEADER = struct.Struct("<I")
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()

#: How much one read takes from the pipe (many frames at once under load).
READ_SIZE = 1 << 20
#: Linux's F_SETPIPE_SZ: a wider pipe lets a step's lines go out in one write.
_F_SETPIPE_SZ = 1031
PIPE_SIZE = 1 << 20

#: The kinds of error an "e" frame carries, so the node raises the same class.
CANCELLED, UNAVAILABLE, FAILED = "c", "u", "x"


def frame(message: list[Any]) -> bytes:
    """One message as a frame."""
    body = _encoder.encode(message)
    return _HEADER.pack(len(body)) + body


class FrameReader:
    """Bytes as they arrive -> whole messages (a frame may come in pieces)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[list[Any]]:
        self._buffer += data
        out: list[list[Any]] = []
        view = memoryview(self._buffer)
        at = 0
        try:
            while len(view) - at >= _HEADER.size:
                (size,) = _HEADER.unpack_from(view, at)
                end = at + _HEADER.size + size
                if end > len(view):
                    break
                out.append(_decoder.decode(view[at + _HEADER.size : end]))
                at = end
        finally:
            view.release()
        del self._buffer[:at]
        return out


def write_all(fd: int, data: bytes) -> None:
    """Write every byte (a pipe may take a large write in parts)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def widen(fd: int) -> None:
    """Ask for a 1 MiB pipe (Linux); elsewhere, or when refused, the default stays."""
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE)


__all__ = ["CANCELLED", "FAILED", "UNAVAILABLE", "FrameReader", "frame", "widen", "write_all"]
