"""Images in request bodies: found (chat `image_url`, Responses `input_image`), read from a
data URL, a Files API file id or an http(s) URL (fetched safely), decoded with Pillow, and
put back in the form the body's engine takes. The runner and the API use it; no engine
imports it."""

from __future__ import annotations

from app.images.decode import Image, prepare
from app.images.errors import ImageError
from app.images.fetch import FetchRules, fetch_image, refused_address
from app.images.parts import ImageRef, find_images, has_images
from app.images.resolve import (
    EMBEDDED_TARGET,
    IMAGE_FILE_PURPOSES,
    ImageResolver,
    ImageTarget,
    Resolved,
    target_for,
)

__all__ = [
    "EMBEDDED_TARGET",
    "IMAGE_FILE_PURPOSES",
    "FetchRules",
    "Image",
    "ImageError",
    "ImageRef",
    "ImageResolver",
    "ImageTarget",
    "Resolved",
    "fetch_image",
    "find_images",
    "has_images",
    "prepare",
    "refused_address",
    "target_for",
]
