"""Where the images of an OpenAI body are: chat `image_url` parts and Responses
`input_image` parts, each with what it names (a data URL, an http(s) URL or a file id) and
a way to put another reference in its place.

Chat: `{"type": "image_url", "image_url": {"url": ..., "detail": "low" | "high" | "auto"}}`
in the `content` list of any message; a `url` that is a Files API id (`file-...`, as a
sheet's image column makes) names that file, as Responses' `file_id` does. Responses: `{"type": "input_image", "image_url": ...,
"file_id": ..., "detail": ...}` in the `content` list of an `input` item.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from app.images.errors import INVALID_IMAGE, ImageError
from app.wire.endpoints import CHAT, RESPONSES

Source = Literal["data", "url", "file"]
#: A Files API id where a URL goes: `file-` and the id's letters (no scheme, no path).
FILE_ID = re.compile(r"^file-[A-Za-z0-9_-]+$")


@dataclass
class ImageRef:
    """One image in a body."""

    #: Its place, as OpenAI names a parameter: `messages[1].content[0].image_url.url`.
    param: str
    source: Source
    #: The URL (data: or http(s)) or the file id.
    value: str
    detail: str | None
    #: The content part that holds it (changed in place by `point_to`).
    part: dict[str, Any]
    endpoint: str

    def point_to(self, url: str) -> None:
        """Make the part name `url` instead (a data URL, or the URL it had): the chat
        part's `image_url.url`; the Responses part's `image_url`, with `file_id` removed."""
        if self.endpoint == CHAT:
            inner = self.part.get("image_url")
            if isinstance(inner, dict):
                inner["url"] = url
            else:  # a bare string, as some clients send: OpenAI's object from now on
                self.part["image_url"] = {"url": url}
        else:
            self.part["image_url"] = url
            self.part.pop("file_id", None)


def find_images(endpoint: str, body: dict[str, Any]) -> list[ImageRef]:
    """Every image of a chat or Responses body, in order; none for other endpoints. A part
    that says it is an image but names none is an ImageError (`invalid_image`)."""
    if endpoint == CHAT:
        return _chat_images(body)
    if endpoint == RESPONSES:
        return _responses_images(body)
    return []


def _chat_images(body: dict[str, Any]) -> list[ImageRef]:
    found: list[ImageRef] = []
    messages = body.get("messages")
    if not isinstance(messages, list):
        return found
    for m, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for p, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            where = f"messages[{m}].content[{p}].image_url"
            inner = part.get("image_url")
            detail = None
            if isinstance(inner, dict):
                url, detail = inner.get("url"), inner.get("detail")
                where += ".url"
            else:
                url = inner
            if not isinstance(url, str) or not url:
                raise ImageError(
                    f"{where} must be an image's URL (http(s) or data:) or a file id.",
                    code=INVALID_IMAGE,
                    param=where,
                )
            found.append(ImageRef(where, _url_source(url), url, _detail(detail), part, CHAT))
    return found


def _responses_images(body: dict[str, Any]) -> list[ImageRef]:
    found: list[ImageRef] = []
    items = body.get("input")
    if not isinstance(items, list):
        return found
    for i, item in enumerate(items):
        content = item.get("content") if isinstance(item, dict) else None
        if not isinstance(content, list):
            continue
        for p, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "input_image":
                continue
            where = f"input[{i}].content[{p}]"
            url, file_id = part.get("image_url"), part.get("file_id")
            if isinstance(url, str) and url:
                ref = ImageRef(f"{where}.image_url", _url_source(url), url, None, part, RESPONSES)
            elif isinstance(file_id, str) and file_id:
                ref = ImageRef(f"{where}.file_id", "file", file_id, None, part, RESPONSES)
            else:
                raise ImageError(
                    f"{where} must have an image_url (http(s) or data:) or a file_id.",
                    code=INVALID_IMAGE,
                    param=where,
                )
            ref.detail = _detail(part.get("detail"))
            found.append(ref)
    return found


def _url_source(url: str) -> Source:
    if url[:5].lower() == "data:":
        return "data"
    return "file" if FILE_ID.match(url) else "url"


def _detail(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def has_images(endpoint: str, body: dict[str, Any]) -> bool:
    """Whether the body names any image (a malformed image part counts)."""
    try:
        return bool(find_images(endpoint, body))
    except ImageError:
        return True
