"""Upstream kinds: the wire an upstream engine speaks, one module a kind.

The engine (engine.py, attempt.py, watch.py) knows HTTP, its queue and its window; what a
request and an answer look like on the wire is its kind's. A kind module (openai.py is the
first) defines `KIND`, an object with the `UpstreamKind` methods below, and names itself in
the table `KINDS` of app/config/upstreams.py (`module:NAME` names another object of a
module: openai.py's kinds for vLLM, SGLang, llama-server, Ollama and batchyard differ only
in how they write a request's reasoning controls, thoughts.py); `kind_of` reads that table.
Whatever the kind, the engine's side of it is OpenAI's: a request body as the Engine
contract takes it, and an answer, a stream chunk or a model object as OpenAI writes them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Protocol

from app.config.upstreams import KINDS, UpstreamSpec
from app.engine.base import EngineError


class StreamReader(Protocol):
    """One streamed answer, read line by line."""

    #: The stream said it is over: the lines after it are not read.
    done: bool

    def read(self, line: bytes) -> list[dict[str, Any]]:
        """The chunks one line of the stream carries (OpenAI's stream chunks, to hand on as
        they come); raises EngineError for an error the upstream sent mid-stream."""
        ...

    def body(self) -> dict[str, Any]:
        """The whole answer the stream made, as if it had been asked for in one piece."""
        ...


class UpstreamKind(Protocol):
    """What one kind of upstream server says on the wire, and how it is read."""

    #: The path its `GET` lists the server's models at: the down-watch's probe.
    models_path: str

    def headers(self, spec: UpstreamSpec) -> dict[str, str]:
        """The headers every request carries (its key, its content type)."""
        ...

    def path(self, endpoint: str) -> str:
        """Where a request for one of batchyard's endpoints (app/wire/endpoints.py) goes,
        appended to the spec's root."""
        ...

    def encode(self, endpoint: str, body: dict[str, Any]) -> bytes:
        """The request body on the wire for an OpenAI request body."""
        ...

    def answer(self, endpoint: str, content: bytes) -> dict[str, Any]:
        """An answer in one piece (status 200) as OpenAI's body; ValueError when unreadable."""
        ...

    def error(self, status: int, content: bytes, engine: str) -> EngineError:
        """An answer other than 200 as the request's error."""
        ...

    def retry_after(self, headers: Mapping[str, str]) -> float | None:
        """Seconds the server asked to wait before the next request, if it said."""
        ...

    def stream(self, endpoint: str, engine: str) -> StreamReader:
        """A reader for one streamed answer."""
        ...

    def models(self, content: bytes) -> list[dict[str, Any]]:
        """The model objects (OpenAI's: `id`, `created`, `owned_by`) a `models_path` answer
        lists; ValueError when it is not such a listing."""
        ...


def kind_of(spec: UpstreamSpec) -> UpstreamKind:
    """The wire `spec` names: the `KIND` of its module in the table KINDS (or the object a
    `module:NAME` entry names)."""
    path, _, name = KINDS[spec.kind].partition(":")
    kind: UpstreamKind = getattr(importlib.import_module(path), name or "KIND")
    return kind


__all__ = ["StreamReader", "UpstreamKind", "kind_of"]
