"""Where the images of an OpenAI body are: chat `image_url` parts and Responses
`input_image` parts, each with what it names (a data URL, an http(s) URL or a file id) and
a way to put another reference in its place.

Chat: `{"type": "image_url", "image_url": {"url": ..., "detail": "low" | "high" | "auto"}}`
in the `content` list of any message; a `url` that is a Files API id (`file-...`, as a
sheet's image column makes) names that file, as Responses' `file_id` does. Responses: `{"type": "input_image", "image_url": ...,
"file_id": ..., "detail": ...}` in the `content` list of an `input` item.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from app.images.errors import INVALID_IMAGE, ImageError
from app.wire.endpoints import CHAT, RESPONSES
from app.wire.image_parts import image_parts, image_source

#: What an image in a body names: a data URL, a URL to fetch, or a file.
Source = Literal["data", "url", "file"]


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
    """Every image of a chat or Responses body, in order (app/wire/image_parts.py walks
    them); none for other endpoints. A part that says it is an image but names none is an
    ImageError (`invalid_image`)."""
    found: list[ImageRef] = []
    for where, part, image in image_parts(endpoint, body):
        url, file_id = image.url, image.file_id
        if isinstance(url, str) and url:
            param, value, source = where + image.url_param, url, _url_source(url)
        elif endpoint == RESPONSES and isinstance(file_id, str) and file_id:
            param, value, source = f"{where}.file_id", file_id, "file"
        elif endpoint == CHAT:
            param = where + image.url_param
            raise ImageError(
                f"{param} must be an image's URL (http(s) or data:) or a file id.",
                code=INVALID_IMAGE,
                param=param,
            )
        else:
            raise ImageError(
                f"{where} must have an image_url (http(s) or data:) or a file_id.",
                code=INVALID_IMAGE,
                param=where,
            )
        found.append(ImageRef(param, source, value, _detail(image.detail), part, endpoint))
    return found


def _url_source(url: str) -> Source:
    """A URL to fetch, unless it is a data URL or a file id (one that is no http(s) URL is
    refused when fetched)."""
    source = image_source(url)
    return "url" if source == "path" else source


def _detail(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def has_images(endpoint: str, body: dict[str, Any]) -> bool:
    """Whether the body names any image (a malformed image part counts)."""
    try:
        return bool(find_images(endpoint, body))
    except ImageError:
        return True
