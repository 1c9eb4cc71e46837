"""A `data:` URL's media type and bytes: the one parser of data URLs, for the image
resolver (app/images/) and the embedded engine (engine/llama/jobs/oai/media.py) alike.

Accepted: `data:<type>[;param...];base64,<payload>`, the scheme and `base64` in any letter
case, base64 that may be wrapped in lines (whitespace is dropped), and not empty. What each
caller then takes of the media type is its own rule (the resolver decodes the bytes; the
engine takes the types llama.cpp decodes). A URL that is not one is a DataURLError with an
OpenAI error code, which each caller raises as its own 400.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field

from app.wire.image_parts import image_source

#: The bytes are missing, not base64, or not a data URL at all.
INVALID_IMAGE = "invalid_image"
#: Over the caller's limit on an image's bytes.
IMAGE_TOO_LARGE = "image_too_large"


class DataURLError(ValueError):
    def __init__(self, message: str, code: str = INVALID_IMAGE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(frozen=True)
class DataURL:
    media_type: str  # lower case; "" when the URL names none
    data: bytes = field(repr=False)


def is_data_url(url: object) -> bool:
    return isinstance(url, str) and image_source(url) == "data"


def parse_data_url(url: str, limit: int | None = None) -> DataURL:
    """The media type and bytes of a base64 data URL; DataURLError if it is not one, or
    (with `limit`) its bytes are more than `limit`."""
    head, comma, payload = url.partition(",")
    fields = [f.strip().lower() for f in head[5:].split(";")] if is_data_url(url) else []
    if not comma or "base64" not in fields[1:]:
        raise DataURLError(
            f"The image's data URL must be base64: data:image/png;base64,... "
            f"(it starts {url[:40]!r})."
        )
    if limit is not None and len(payload) * 3 // 4 > limit + 2:
        raise DataURLError(f"more than {limit} bytes", IMAGE_TOO_LARGE)
    try:
        data = base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise DataURLError("The image's data URL is not valid base64.") from None
    if not data:
        raise DataURLError("The image's data URL holds no bytes.")
    if limit is not None and len(data) > limit:
        raise DataURLError(f"more than {limit} bytes", IMAGE_TOO_LARGE)
    return DataURL(fields[0], data)
