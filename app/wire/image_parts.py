"""Where a body's images are, as OpenAI's wire shapes them, and what an image's URL names:
the one walker of image parts and the one classifier of their sources, for the image
resolver (app/images/), the embedded engine's chat template and Responses translation,
the dashboard's thumbnails and a sheet's image cells.

Chat: `{"type": "image_url", "image_url": {"url": ..., "detail": ...}}` (or `image_url` a
bare string, as some clients send) in the `content` list of a message. Responses:
`{"type": "input_image", "image_url": ..., "file_id": ..., "detail": ...}` in the `content`
list of an `input` item. Values are given as sent: each caller says what it refuses.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from app.wire.endpoints import CHAT, RESPONSES

#: What an image URL names: a data URL, a Files API id, an http(s) URL, or anything else
#: (a path, to a sheet's folder; to a request, a URL that is refused when fetched).
Source = Literal["data", "file", "url", "path"]
#: A Files API id where a URL goes: `file-` and the id's letters (no scheme, no path).
FILE_ID = re.compile(r"^file-[A-Za-z0-9_-]+$")
#: Each endpoint's list of messages (or items) and the type of its image parts.
_IMAGES = {CHAT: ("messages", "image_url"), RESPONSES: ("input", "input_image")}


def image_source(url: str) -> Source:
    """What `url` names, by its spelling alone."""
    if url[:5].lower() == "data:":
        return "data"
    if FILE_ID.match(url):
        return "file"
    if url[:8].lower().startswith(("http://", "https://")):
        return "url"
    return "path"


@dataclass(frozen=True)
class ImagePart:
    """The image one content part names, with the values as sent."""

    #: The image URL: chat's `image_url.url` (or the bare `image_url`), Responses' `image_url`.
    url: Any
    #: Responses' `file_id` (chat names a file by its id in `url`).
    file_id: Any
    detail: Any
    #: Where the URL is, after the part's own place: `.image_url.url` or `.image_url`.
    url_param: str


def image_part(endpoint: str, part: Any) -> ImagePart | None:
    """The image a content part of an `endpoint` body names; None for a part that is not
    an image part of that endpoint."""
    if not isinstance(part, dict) or endpoint not in _IMAGES:
        return None
    if part.get("type") != _IMAGES[endpoint][1]:
        return None
    if endpoint == CHAT:
        inner = part.get("image_url")
        if isinstance(inner, dict):
            return ImagePart(inner.get("url"), None, inner.get("detail"), ".image_url.url")
        return ImagePart(inner, None, None, ".image_url")
    return ImagePart(part.get("image_url"), part.get("file_id"), part.get("detail"), ".image_url")


def image_parts(endpoint: str, body: Any) -> Iterator[tuple[str, dict[str, Any], ImagePart]]:
    """Every image part of a chat or Responses body, in order: its place
    (`messages[1].content[0]`), the part itself, and what it names; none for another
    endpoint or a body of another shape."""
    if endpoint not in _IMAGES or not isinstance(body, dict):
        return
    key = _IMAGES[endpoint][0]
    items = body.get(key)
    if not isinstance(items, list):
        return
    for m, item in enumerate(items):
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(content, list):
            continue
        for p, part in enumerate(content):
            image = image_part(endpoint, part)
            if image is not None:
                yield f"{key}[{m}].content[{p}]", part, image
