"""JSON on every line's path: msgspec's encoder and decoder, behind two functions.

A batch line is decoded when it is handed to the engine, its request encoded and its answer
decoded by the upstream client, and the result encoded when it is recorded: four times a
line. The standard library's json does that at several times msgspec's cost
(bench/fleet.py). Decode errors are ValueErrors, as the standard library's are.
"""

from __future__ import annotations

from typing import Any

import msgspec

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()

#: What `loads` raises on text that is not JSON (a ValueError).
DecodeError = msgspec.DecodeError


def loads(data: bytes | str) -> Any:
    """The value of one JSON document."""
    return _decoder.decode(data)


def dumps_bytes(value: Any) -> bytes:
    """`value` as compact UTF-8 JSON."""
    return _encoder.encode(value)


def dumps(value: Any) -> str:
    """`value` as compact JSON text (for a Text column)."""
    return _encoder.encode(value).decode("utf-8")
