"""The errors of an image that cannot be used: each fails its own line (or online request)
with a 400 that names the image's place in the body and what was wrong with it."""

from __future__ import annotations

from app.engine.base import EngineError

# INVALID_IMAGE (the bytes or the file are not an image Pillow can decode, or the part is
# malformed) and IMAGE_TOO_LARGE (over --max-image-bytes, or more pixels than batchyard
# decodes) are the data-URL parser's codes too, which the engine reads below this package.
from app.engine.data_urls import IMAGE_TOO_LARGE, INVALID_IMAGE

#: An image, but not PNG, JPEG, WEBP or GIF.
INVALID_IMAGE_FORMAT = "invalid_image_format"
#: A URL batchyard does not fetch: not http(s) or data:, or an address that is not public.
IMAGE_URL_REFUSED = "image_url_refused"
#: The fetch failed: no answer within --image-fetch-timeout, an HTTP error, a bad redirect.
IMAGE_FETCH_FAILED = "image_fetch_failed"
#: A `file_id` that names no file of the owner's, or one not uploaded for images.
INVALID_IMAGE_FILE = "invalid_image_file"


class ImageError(EngineError):
    """One image of a request cannot be used: a 400 with one of the codes above, naming its param."""

    def __init__(self, message: str, *, code: str, param: str | None = None) -> None:
        super().__init__(message, status_code=400, code=code, param=param)

    def at(self, param: str) -> ImageError:
        """The same error, placed at `param` (the image's path in the body)."""
        return ImageError(self.message, code=self.code or INVALID_IMAGE, param=param)


__all__ = [
    "IMAGE_FETCH_FAILED",
    "IMAGE_TOO_LARGE",
    "IMAGE_URL_REFUSED",
    "INVALID_IMAGE",
    "INVALID_IMAGE_FILE",
    "INVALID_IMAGE_FORMAT",
    "ImageError",
]
