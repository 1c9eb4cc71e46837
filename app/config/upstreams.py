"""The `--engine NAME=KIND:URL[,...]` flag: an upstream's spec, parsed or refused with why.

KINDS is the table of the wires batchyard speaks to an upstream: a kind's name (what comes
between `=` and `:`) and the module that speaks it (app/engine/upstream/kinds/). The parser
accepts the kinds it names; the engine loads the module of its spec's kind.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import urlsplit

#: Each upstream kind and the module that speaks its wire, as `KIND` (the UpstreamKind of
#: app/engine/upstream/kinds/__init__.py), or `module:NAME` for another of its objects. A
#: new kind is one module there (or one object of one) and one line here.
KINDS: dict[str, str] = {
    "openai": "app.engine.upstream.kinds.openai",  # an OpenAI-compatible server
    # The same wire, each server's reasoning controls written its way (kinds/thoughts.py).
    "vllm": "app.engine.upstream.kinds.openai:VLLM",
    "sglang": "app.engine.upstream.kinds.openai:SGLANG",
    "llama-server": "app.engine.upstream.kinds.openai:LLAMA_SERVER",
    "ollama": "app.engine.upstream.kinds.openai:OLLAMA",
    "batchyard": "app.engine.upstream.kinds.openai:BATCHYARD",
}
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SPEC_HELP = (
    "NAME=KIND:URL[,key=KEY,models=a|b,concurrency=N,retries=N,backoff=SECONDS,timeout=SECONDS,"
    "images=pass|inline|png,image_max_side=N,priority=on|off]"
)
#: How an upstream gets a line's images (app/images/): `pass` sends http(s) URLs as they are
#: (file ids become data URLs: the upstream cannot read batchyard's files); `inline` makes
#: every image a data URL; `png` too, with WEBP and GIF as PNG.
IMAGE_MODES = ("pass", "inline", "png")
#: The default mode of a server found by its usual port: Ollama takes data URLs only;
#: LM Studio takes data URLs only and refuses some WEBP (lmstudio-bug-tracker#1752).
IMAGE_MODE_BY_PORT = {11434: "inline", 1234: "png"}


@dataclass(frozen=True)
class UpstreamSpec:
    """One `--engine` flag: where an upstream server is, the wire it speaks and how to use it."""

    name: str
    url: str  # the API base as the openai SDK takes it, e.g. http://gpu1:8000/v1
    kind: str = "openai"  # its wire: a name in KINDS
    key: str = ""
    models: tuple[str, ...] = ()
    concurrency: int = 16
    retries: int = 6  # tries after the first, for connection errors, timeouts, 429 and 5xx
    #: Seconds before the first retry, twice as long before each next one (at most 30 s),
    #: unless the server's Retry-After says otherwise.
    backoff: float = 0.5
    timeout: float = 600.0  # seconds to wait for one answer
    images: str = ""  # one of IMAGE_MODES; empty: the default for the server (image_mode)
    image_max_side: int = 0  # images larger than this many pixels a side are scaled down
    #: Send vLLM's and SGLang's `priority` on each batch line, from its batch's deadline
    #: (app/batches/claims/claims.py: line_priority); online requests send none.
    priority: bool = False

    @property
    def image_mode(self) -> str:
        """How this upstream gets images: `images=` as given, else `inline` or `png` for a
        server on Ollama's or LM Studio's port, else `pass` (vLLM, SGLang, llama-server
        and batchyard fetch URLs themselves)."""
        if self.images:
            return self.images
        try:
            port = urlsplit(self.url).port
        except ValueError:
            port = None
        return IMAGE_MODE_BY_PORT.get(port or 0, "pass")

    @property
    def root(self) -> str:
        """The URL the endpoints' paths (`/v1/...`) are appended to."""
        base = self.url.rstrip("/")
        return base[: -len("/v1")] if base.endswith("/v1") else base


def parse_engine_spec(text: str) -> UpstreamSpec:
    """`NAME=KIND:URL[,key=...,models=a|b,concurrency=N]` -> UpstreamSpec; ValueError says
    what is wrong with it. KIND is a name in KINDS."""
    where = f"--engine {text!r}"
    name, kind, url, options = _spec_head(where, text)
    values: dict[str, Any] = {"name": name, "url": url.rstrip("/"), "kind": kind}
    for option in options:
        key, eq, value = option.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"{where}: option {option!r} must be key=value ({SPEC_HELP})")
        read = _OPTIONS.get(key)
        if read is None:
            raise ValueError(
                f"{where}: unknown option {key!r}; the options are key, models, concurrency, "
                "retries, backoff, timeout, images, image_max_side and priority"
            )
        try:
            values[key] = read(value)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return UpstreamSpec(**values)


def _spec_head(where: str, text: str) -> tuple[str, str, str, list[str]]:
    """`NAME=KIND:URL,options...` -> (name, kind, url, the options as written)."""
    name, eq, rest = text.strip().partition("=")
    name = name.strip()
    if not eq or not rest:
        raise ValueError(f"{where}: expected {SPEC_HELP}")
    if not NAME_PATTERN.match(name):
        raise ValueError(
            f"{where}: the engine name {name!r} must be letters, digits, '.', '_' or '-'"
        )
    if name == "embedded":
        raise ValueError(f"{where}: 'embedded' is the built-in engine's name; choose another")
    kind, colon, rest = rest.partition(":")
    kind = kind.strip()
    if not colon or kind not in KINDS:
        known = " or ".join(repr(k) for k in KINDS)
        raise ValueError(f"{where}: the engine kind must be {known}: {SPEC_HELP}")
    url, *options = [part.strip() for part in rest.split(",")]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{where}: {url!r} is not an http(s) URL, e.g. http://127.0.0.1:8000/v1")
    return name, kind, url, options


def _models_option(value: str) -> tuple[str, ...]:
    models = tuple(m.strip() for m in value.split("|") if m.strip())
    if not models:
        raise ValueError("models= names no model (separate names with '|')")
    return models


def _count_option(key: str, low: int, high: int, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if not low <= number <= high:
        raise ValueError(f"{key} must be a whole number from {low} to {high}")
    return number


def _seconds_option(key: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        raise ValueError(f"{key} must be a number of seconds above 0")
    return seconds


def _images_option(value: str) -> str:
    mode = value.strip().lower()
    if mode not in IMAGE_MODES:
        raise ValueError(f"images must be one of {', '.join(IMAGE_MODES)}")
    return mode


def _image_max_side_option(value: str) -> int:
    try:
        side = int(value)
    except ValueError:
        side = 0
    if not 16 <= side <= 65535:
        raise ValueError("image_max_side must be a number of pixels, 16 or more")
    return side


def _priority_option(value: str) -> bool:
    if value.strip().lower() not in ("on", "off"):
        raise ValueError("priority must be on or off")
    return value.strip().lower() == "on"


#: Each option of an --engine spec -> its reader: the value as written -> the field's value,
#: or a ValueError that says what is wrong with it.
_OPTIONS: dict[str, Callable[[str], Any]] = {
    "key": str,
    "models": _models_option,
    "concurrency": partial(_count_option, "concurrency", 1, 4096),
    "retries": partial(_count_option, "retries", 0, 100),
    "backoff": partial(_seconds_option, "backoff"),
    "timeout": partial(_seconds_option, "timeout"),
    "images": _images_option,
    "image_max_side": _image_max_side_option,
    "priority": _priority_option,
}


def parse_engine_specs(texts: list[str]) -> list[UpstreamSpec]:
    """Every `--engine`, checked; two with one name are refused."""
    specs = [parse_engine_spec(t) for t in texts]
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise ValueError(f"--engine: two engines are named {spec.name!r}")
        seen.add(spec.name)
    return specs


__all__ = [
    "IMAGE_MODES",
    "KINDS",
    "SPEC_HELP",
    "UpstreamSpec",
    "parse_engine_spec",
    "parse_engine_specs",
]
